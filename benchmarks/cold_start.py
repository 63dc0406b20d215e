"""Cold start of an app: from `import edgespec` to the first streamed token, stage by stage.

Each run is a fresh Python process (nothing cached in memory; the OS page cache is whatever it is,
warm after the first run). Stages, in seconds:
  import    `from edgespec.runtime import Bundle, SpeculativeDecoder`
  load      `Bundle.load(path)` with the API's default verify mode
  sessions  `SpeculativeDecoder(bundle)` (ORT sessions for target and drafter, tables)
  first     `next(decoder.stream(prompt, chat=True))`: the first token's text
  total     the sum: what an app waits for

    python benchmarks/cold_start.py --bundle bundles/qwen-coder-int4 --runs 3
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

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


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bundle", required=True)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--prompt", default="Write a haiku about autumn.")
    ap.add_argument("--json", help="write every run's stages here too")
    args = ap.parse_args(argv)
    runs = []
    for i in range(args.runs):
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
