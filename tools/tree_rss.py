"""Peak memory of a command and all its descendants, sampled.

`/usr/bin/time -v` reports the largest *single* process's max RSS (ru_maxrss of the children); an
export runs the model builder as a child process, so the machine needs the *sum* over the process
tree. This samples /proc every INTERVAL seconds and reports both, plus a timeline.

    python tools/tree_rss.py [--interval 0.25] [--log FILE] -- COMMAND ARGS...

Prints (to stderr, at the end): peak tree RSS (sum) and anonymous RSS, peak single-process RSS, and which command line
held the most at the tree's peak. --log writes `seconds tree_MB tree_anon_MB top_MB top_cmd` lines.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time


def _children(pid: int) -> list[int]:
    out = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out += [int(x) for x in f.read().split()]
    except OSError:
        pass
    return out


def _rss_mb(pid: int) -> tuple[float, float]:
    """(RSS, anonymous RSS) in MiB: RSS also counts mapped file pages (safetensors and ONNX external data
    are memory-mapped), which the kernel can drop under pressure; anonymous memory it cannot."""
    rss = anon = 0.0
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    rss = int(line.split()[1]) / 1024
                elif line.startswith("RssAnon:"):
                    anon = int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        pass
    return rss, anon


def _cmd(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")[:160]
    except OSError:
        return "?"


def tree(pid: int) -> list[int]:
    seen, todo = [], [pid]
    while todo:
        p = todo.pop()
        seen.append(p)
        todo += _children(p)
    return seen


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--interval", type=float, default=0.25)
    ap.add_argument("--log", help="timeline file")
    ap.add_argument("command", nargs=argparse.REMAINDER)
    args = ap.parse_args(argv)
    cmd = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not cmd:
        ap.error("give a command after --")
    t0 = time.time()
    proc = subprocess.Popen(cmd)
    peak_tree = peak_anon = peak_single = 0.0
    at_peak = ""
    log = open(args.log, "w") if args.log else None
    try:
        while proc.poll() is None:
            mem = {p: _rss_mb(p) for p in tree(proc.pid)}
            total, anon = sum(m[0] for m in mem.values()), sum(m[1] for m in mem.values())
            top = max(mem, key=lambda p: mem[p][0])
            if total > peak_tree:
                peak_tree, at_peak = total, f"{mem[top][0]:.0f} MB in {_cmd(top)}"
            peak_anon = max(peak_anon, anon)
            peak_single = max(peak_single, mem[top][0])
            if log:
                log.write(f"{time.time() - t0:.1f} {total:.0f} {anon:.0f} {mem[top][0]:.0f} {_cmd(top)[:100]}\n")
                log.flush()
            time.sleep(args.interval)
    finally:
        if log:
            log.close()
    rc = proc.wait()
    print(f"tree_rss: {time.time() - t0:.1f} s, exit {rc}; peak tree RSS {peak_tree / 1024:.2f} GB "
          f"(largest process then: {at_peak}); peak tree anonymous RSS {peak_anon / 1024:.2f} GB; "
          f"peak single process RSS {peak_single / 1024:.2f} GB", file=sys.stderr)
    return rc


if __name__ == "__main__":
    sys.exit(main())
