"""Two identical target sessions in one process, each timed alone: is the first one made slower?

On the 2-core Xeon (2026-11-27, the demo's int4 1.5B, 2 threads) the first made ran 1-token steps at
64-68 ms and the second at 59-62 ms, whichever ran first; `edgespec bench` makes the drafting rows'
session first, so its default row pays that (docs/results.md). Prints each session's median 1-token step
per generation, first, second, then first again.

    python benchmarks/session_order.py --bundle B --threads 2
"""
from __future__ import annotations

import argparse
import statistics

from edgespec.runtime import SpeculativeDecoder

PROMPT = "Explain why the sky is blue in three sentences."


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bundle", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=40)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    first, second = (SpeculativeDecoder(args.bundle, strategy="ar", threads=args.threads).variant(
        "ar", plain_steps="fast") for _ in range(2))
    for name, dec in (("first", first), ("second", second), ("first", first)):
        steps = [statistics.median(dec.generate(PROMPT, max_new_tokens=args.tokens).stats.verify_ms_by_k[1])
                 for _ in range(args.runs)]
        print(f"{name:6s} session: median 1-token step " + ", ".join(f"{ms:.1f}" for ms in steps) + " ms", flush=True)


if __name__ == "__main__":
    main()
