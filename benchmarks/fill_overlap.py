"""The drafter's window fill in turn with the target's work, or on a thread beside it: does a second
core hide it? Greedy decoding never needs the fill before the first drafting round, so the runtime
runs it after the first token (docs/runtime.md, "Long prompts"); this measures the alternative.

    python benchmarks/fill_overlap.py --bundle bundles/qwen-coder-int4 --prompts benchmarks/heldout13.jsonl \
        --ids writing-2,extraction-1 --threads 2 [--draft-threads 1] [--steps 4] [--repeats 2]

Per prompt (chat template) and repeat, wall times in ms of:
- `prefill`: the target's prefill alone, then the fill alone (the window's first fill: the whole prompt
  up to the window, else its last window // 4 tokens), and both on two threads at once;
- `steps`: after a prefill, `--steps` 1-token target steps alone, then the fill alone, and both at once.
"""
from __future__ import annotations

import argparse
import json
import threading
import time


def timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return (time.perf_counter() - t) * 1e3


def together(a, b) -> float:
    """Wall ms of a() on this thread with b() on another."""
    th = threading.Thread(target=b)
    t = time.perf_counter()
    th.start()
    a()
    th.join()
    return (time.perf_counter() - t) * 1e3


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bundle", required=True)
    ap.add_argument("--prompts", default="benchmarks/heldout13.jsonl")
    ap.add_argument("--ids", default="writing-2,extraction-1")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--draft-threads", type=int)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args(argv)

    from edgespec.calibrate.prompts import load_prompts
    from edgespec.runtime import Bundle, SpeculativeDecoder
    from edgespec.runtime.round.context import REFILL_FRACTION
    from edgespec.runtime.api.checks import DEFAULT_DRAFTER_WINDOW

    dec = SpeculativeDecoder(Bundle.load(args.bundle, verify="fast"), strategy="tli", threads=args.threads,
                             options=dict(draft_threads=args.draft_threads, defer_drafter=False, prefix_reuse=False))
    target, drafter = dec.target, dec.drafter
    prompts = {p.id: p for p in load_prompts(args.prompts, "all")}
    for pid in args.ids.split(","):
        ids = dec.generate(prompts[pid].text, max_new_tokens=1, chat=True).prompt_token_ids
        fill_ids = ids if len(ids) <= DEFAULT_DRAFTER_WINDOW else ids[-(DEFAULT_DRAFTER_WINDOW // REFILL_FRACTION):]

        def prefill():
            target.reset()
            target.forward(ids, last=1)

        def steps():
            for tok in ids[:args.steps]:
                target.forward([tok], last=1)

        def fill():
            drafter.reset()
            drafter.forward(fill_ids, last=1)

        for rep in range(args.repeats):
            row = {"id": pid, "repeat": rep, "prompt_tokens": len(ids), "fill_tokens": len(fill_ids),
                   "prefill": timed(prefill), "fill": timed(fill)}
            row["prefill_and_fill_together"] = together(prefill, fill)
            prefill()
            row["steps"] = timed(steps)
            prefill()
            row["steps_and_fill_together"] = together(steps, fill)
            print(json.dumps({k: round(v) if isinstance(v, float) else v for k, v in row.items()}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
