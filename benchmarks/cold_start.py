"""Cold start of an app: from `import edgespec` to the first streamed token, stage by stage.

Each run is a fresh Python process (nothing cached in memory; the OS page cache is whatever it is,
warm after the first run). Stages, in seconds:
  import    `from edgespec.runtime import Bundle, SpeculativeDecoder`
  load      `Bundle.load(path)` with the API's default verify mode
  sessions  `SpeculativeDecoder(bundle)` (ORT sessions for target and drafter, tables)
  first     `next(decoder.stream(prompt, chat=True))`: the first token's text
  total     the sum: what an app waits for

    python benchmarks/cold_start.py --bundle bundles/qwen-coder-int4 --runs 3
    python benchmarks/cold_start.py --bundle bundles/qwen-coder-int4 --runs 3 --evict

--evict drops the bundle's files and the shared libraries the runtime loads (onnxruntime, tokenizers,
NumPy) from the OS page cache before each run (`posix_fadvise(DONTNEED)`; checked with `fincore` where
it exists), which is what the first load after a reboot finds: every byte read from the disk again.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
from edgespec.runtime import Bundle, SpeculativeDecoder
t1 = time.perf_counter()
bundle = Bundle.load(sys.argv[1])
t2 = time.perf_counter()
dec = SpeculativeDecoder(bundle)
t3 = time.perf_counter()
stream = dec.stream([{"role": "user", "content": sys.argv[2]}], max_new_tokens=8, chat=True)
next(stream)
t4 = time.perf_counter()
stream.close()
print(json.dumps({"import": t1 - t0, "load": t2 - t1, "sessions": t3 - t2, "first": t4 - t3, "total": t4 - t0}))
"""


def evict(paths) -> int:
    """Ask the kernel to drop these files' cached pages; returns the bytes asked for."""
    total = 0
    for path in paths:
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            continue
        try:
            if os.access(path, os.W_OK):
                os.fsync(fd)            # dirty pages are not dropped
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            total += os.fstat(fd).st_size
        finally:
            os.close(fd)
    return total


def runtime_files(bundle: str) -> list[str]:
    """The bundle's files (symlinks followed) and the runtime's shared libraries and its Python files."""
    import importlib.util

    files = [str(p.resolve()) for p in Path(bundle).rglob("*") if p.is_file()]
    for mod in ("onnxruntime", "tokenizers", "numpy", "edgespec"):
        spec = importlib.util.find_spec(mod)
        if spec and spec.origin:
            root = Path(spec.origin).parent
            files += [str(p) for p in root.rglob("*") if p.is_file() and p.suffix in (".so", ".py", ".pyc")]
    return files


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bundle", required=True)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--prompt", default="Write a haiku about autumn.")
    ap.add_argument("--json", help="write every run's stages here too")
    ap.add_argument("--evict", action="store_true", help="drop the bundle and runtime files from the page cache "
                                                          "before each run (a first load after a reboot)")
    args = ap.parse_args(argv)
    runs = []
    files = runtime_files(args.bundle) if args.evict else []
    for i in range(args.runs):
        if files:
            print(f"evicted {evict(files) / 1e9:.2f} GB from the page cache", flush=True)
        out = subprocess.run([sys.executable, "-c", CHILD, args.bundle, args.prompt], capture_output=True, text=True)
        if out.returncode != 0:
            print(out.stderr.strip().splitlines()[-1] if out.stderr.strip() else "run failed", file=sys.stderr)
            return 1
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
        print(f"run {i + 1}: " + "  ".join(f"{k} {v:.2f}s" for k, v in runs[-1].items()), flush=True)
    print("median: " + "  ".join(f"{k} {statistics.median(r[k] for r in runs):.2f}s" for k in runs[0]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(runs, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
