"""Per-prompt decode-rate ratios from a bench run's records (REPORT/records.jsonl): each row's median decode
rate over repeats (tokens after the first / time after the first token, a drafter's fill included),
divided by the baseline row's on the same prompt, and each row's pooled rate (all its tokens / all its
decode time) over the baseline's. The worst prompt per row is what "never slower on any prompt" is about.

    python benchmarks/prompt_ratios.py REPORT/records.jsonl [BASELINE_ROW]     # default ar-fast
"""
from __future__ import annotations

import json
import statistics
import sys
from collections import defaultdict


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    records = [json.loads(line) for line in open(argv[0], encoding="utf-8")][1:]    # the first: the fingerprint
    base = argv[1] if len(argv) > 1 else "ar-fast"
    rates, tokens, ms = defaultdict(list), defaultdict(float), defaultdict(float)
    for r in records:
        n, t = r["new_tokens"] - r["prefill_tokens"], r["total_ms"] - r["ttft_ms"]
        rates[(r["prompt_id"], r["strategy"])].append(n / t * 1e3)
        tokens[r["strategy"]] += n
        ms[r["strategy"]] += t
    prompts, rows = sorted({p for p, _ in rates}), sorted({s for _, s in rates})
    pooled = {s: tokens[s] / ms[s] * 1e3 for s in rows}
    print("pooled decode tok/s:", {s: round(v, 2) for s, v in pooled.items()})
    print(f"pooled x {base}:", {s: round(v / pooled[base], 3) for s, v in pooled.items()})
    print(f"{'prompt':20s}", *[f"{s[:12]:>12s}" for s in rows])
    worst = {s: float("inf") for s in rows}
    for p in prompts:
        b = statistics.median(rates[(p, base)])
        ratio = {s: statistics.median(rates[(p, s)]) / b for s in rows if (p, s) in rates}
        for s, v in ratio.items():
            worst[s] = min(worst[s], v)
        print(f"{p:20s}", *[f"{ratio.get(s, float('nan')):12.3f}" for s in rows])
    print("worst prompt:", {s: round(v, 3) for s, v in worst.items()})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
