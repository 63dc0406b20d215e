"""`edgespec demo` (what `make demo` runs): pull -> calibrate -> export -> bench -> print the report.

1. pull the pair's models (`edgespec models pull`; cached once converted);
2. calibrate on target-generated completions of HumanEval's calib split, with a bounded token budget
   (`edgespec calibrate --source target`), keeping the pair's K tokens;
3. export the bundle with that vocabulary (`edgespec export --vocab`; single-model ONNX exports are
   cached, so a re-export only re-prunes);
4. bench on a few prompts of HumanEval's test split (disjoint from calib): ar against tli, greedy;
5. print the report table and the plot paths.
Each step runs as its own `python -m edgespec` process (a 1.5B export peaks near 15 GB; the bench must
not inherit that). A step whose inputs (its command line and the digest of what it reads) match the
last successful run, and whose outputs still exist, is skipped: a second run reuses everything.
State: OUT/demo-state.json. OUT defaults to <edgespec cache>/demo/<pair>.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import time
from pathlib import Path

from edgespec.models import default_pair, get_pair
from edgespec.paths import cache_home, models_dir
from edgespec.profiler.errors import BenchError
from edgespec.profiler.report import lossless_line, table
from edgespec.runtime.manifest import MANIFEST

STATE = "demo-state.json"


def register_demo(subparsers, csv_list, int_list) -> None:
    p = subparsers.add_parser("demo", help="pull, calibrate, export and bench a pair end to end (make demo)",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pair", help="pair recipe (default: the default pair, qwen-coder); smollm-self is quick")
    p.add_argument("--out", type=Path, help="demo directory (default <cache>/demo/<pair>)")
    p.add_argument("--calib-tokens", type=int, default=1024, help="target-generated calibration tokens (default 1024)")
    p.add_argument("--keep", type=int, help="kept drafter tokens (default: the pair's)")
    p.add_argument("--affinity", choices=["cooc", "cov"], help="also estimate M (enables the rdk strategy)")
    p.add_argument("--prompts", type=int, default=5, help="held-out HumanEval prompts to bench (default 5)")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--strategies", type=csv_list, default=["ar", "tli"])
    p.add_argument("--draft-length", type=int_list, default=[2, 4])
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--remeasure", action="store_true", help="re-run the bench even if its inputs are unchanged")
    p.set_defaults(func=run_demo)


def _digest(*parts) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(json.dumps(part, sort_keys=True, default=str).encode("utf-8"))
    return h.hexdigest()[:24]


def _file_digest(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest() if Path(path).is_file() else "-"


class Steps:
    """Runs `python -m edgespec ...` steps, skipping those whose key matches the recorded state."""

    def __init__(self, out: Path):
        self.out = out
        self.path = out / STATE
        try:
            self.state = json.loads(self.path.read_text()) if self.path.is_file() else {}
        except ValueError:
            self.state = {}
        self.times: dict[str, float] = {}

    def run(self, name: str, argv: list[str], key: str, outputs: list[Path], force: bool = False,
            stdout=None) -> bool:
        """Returns True if the step ran, False if it was reused."""
        done = self.state.get(name, {})
        if not force and done.get("key") == key and all(p.exists() for p in outputs):
            print(f"edgespec demo: [{name}] reused (inputs unchanged)", file=sys.stderr)
            self.times[name] = 0.0
            return False
        print(f"edgespec demo: [{name}] edgespec {' '.join(argv)}", file=sys.stderr)
        t0 = time.time()
        proc = subprocess.run([sys.executable, "-m", "edgespec", *argv], stdout=stdout)
        self.times[name] = time.time() - t0
        if proc.returncode != 0:
            raise BenchError(f"demo step {name!r} failed (exit {proc.returncode}); fix the error above and re-run "
                             "`edgespec demo` (finished steps are reused)")
        self.state[name] = {"key": key, "seconds": round(self.times[name], 1),
                            "finished_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        self.path.write_text(json.dumps(self.state, indent=1) + "\n")
        return True


def run_demo(args) -> int:
    pair = get_pair(args.pair) if args.pair else default_pair()
    out = Path(args.out or cache_home() / "demo" / pair.name).expanduser().absolute()
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise BenchError(f"demo directory {out} is not writable ({exc.strerror or exc})") from None
    keep = args.keep or pair.keep
    vocab, bundle, report = out / "vocab.json", out / "bundle", out / "report"
    steps = Steps(out)
    t0 = time.time()

    pulled = [models_dir() / m / "config.json" for m in dict.fromkeys((pair.target, pair.drafter))]
    steps.run("pull", ["models", "pull", pair.name], _digest(pair.name, "pull"), pulled)
    calib = ["calibrate", "--pair", pair.name, "--source", "target", "--prompts", "humaneval", "--split", "calib",
             "--max-tokens", str(args.calib_tokens), "--keep", str(keep), "--out", str(vocab)]
    if args.affinity:
        calib += ["--affinity", args.affinity]
    steps.run("calibrate", calib, _digest(calib), [vocab])
    export = ["export", "--pair", pair.name, "--vocab", str(vocab), "--out", str(bundle)]
    steps.run("export", export, _digest(export, _file_digest(vocab)), [bundle / MANIFEST])
    bench = ["bench", "--bundle", str(bundle), "--prompts", "humaneval", "--split", "test", "--limit",
             str(args.prompts), "--strategies", ",".join(args.strategies), "--draft-length",
             ",".join(map(str, args.draft_length)), "--max-new-tokens", str(args.max_new_tokens), "--temperature", "0",
             "--repeats", str(args.repeats), "--report", str(report)]
    steps.run("bench", bench, _digest(bench, _file_digest(bundle / MANIFEST)), [report / "report.json"],
              force=args.remeasure, stdout=subprocess.DEVNULL)     # its table is printed below
    _print_summary(report, steps.times, time.time() - t0)
    return 0


def _print_summary(report: Path, times: dict, total_s: float) -> None:
    doc = json.loads((report / "report.json").read_text())
    print(table(doc))
    print("\n" + lossless_line(doc))
    print(f"\nreport: {report / 'report.md'}")
    for name in doc.get("plots", []):
        print(f"plot:   {report / name}")
    steps = ", ".join(f"{k} {v:.0f} s" for k, v in times.items())
    print(f"\ndemo finished in {total_s:.0f} s ({steps})")
