"""The drafter's first window fill: bounded (the last drafter_window // 4 tokens, then growing: the runtime
since 2026-11-27) against the whole prompt up to the window (before), interleaved per prompt.

For each held-out prompt: `ar` once (the reference), then the default decoder's speculative strategy with
the first fill bounded and whole, in alternating order. Per mode: the first fill's ms and tokens, drafts
accepted, decode tok/s (tokens after the first / time after the first), outputs differing from `ar`.

    python benchmarks/first_fill.py --bundle B --prompts benchmarks/heldout13.jsonl --split calib --threads 2
"""
from __future__ import annotations

import argparse
import json
from contextlib import contextmanager

from edgespec.calibrate.prompts import load_prompts
from edgespec.runtime import Bundle, SpeculativeDecoder
from edgespec.runtime.round import context


STATS = {"fill_ms": "draft_prefill_ms", "fill_tokens": "draft_prefill_tokens", "drafted": "drafted",
         "accepted": "accepted"}      # totals per mode: GenerationStats fields


@contextmanager
def whole_first_fill():
    """The first fill as before 2026-11-27: the whole text where it fits in the window."""
    original = context.DrafterWindow.inputs

    def inputs(self, ids, runner):
        if runner.length == 0 and self.anchor == 0 and self.size is not None and len(ids) <= self.size:
            saved, self.size = self.size, None          # no re-anchoring for this fill
            try:
                return original(self, ids, runner)
            finally:
                self.size = saved
        return original(self, ids, runner)
    context.DrafterWindow.inputs = inputs
    try:
        yield
    finally:
        context.DrafterWindow.inputs = original


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bundle", required=True)
    ap.add_argument("--prompts", default="benchmarks/heldout13.jsonl")
    ap.add_argument("--split", default="calib")
    ap.add_argument("--limit", type=int, default=13)
    ap.add_argument("--strategy", default="ngram-tli")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    bundle = Bundle.load(args.bundle)
    dec = SpeculativeDecoder(bundle, strategy=args.strategy, threads=args.threads, prefix_reuse=False)
    ar = dec.variant("ar")
    tot = {m: {"fill_ms": 0.0, "fill_tokens": 0, "drafted": 0, "accepted": 0, "decode_ms": 0.0, "tokens": 0,
               "differ": 0} for m in ("bounded", "whole")}
    dec.generate("def f(x):", max_new_tokens=8)               # warm-up: sessions built, kernels touched
    for i, p in enumerate(load_prompts(args.prompts, args.split)[:args.limit]):
        ref = ar.generate(p.text, max_new_tokens=args.max_new_tokens, chat=True)
        for mode in (("bounded", "whole") if i % 2 == 0 else ("whole", "bounded")):
            if mode == "whole":
                with whole_first_fill():
                    r = dec.generate(p.text, max_new_tokens=args.max_new_tokens, chat=True)
            else:
                r = dec.generate(p.text, max_new_tokens=args.max_new_tokens, chat=True)
            st, t = r.stats, tot[mode]
            for key, stat in STATS.items():
                t[key] += getattr(st, stat)
            t["decode_ms"] += st.total_ms - st.ttft_ms
            t["tokens"] += max(0, st.new_tokens - 1)
            t["differ"] += r.token_ids != ref.token_ids
        print(json.dumps({"prompt": p.id, "prompt_tokens": ref.stats.prompt_tokens}), flush=True)
    for mode, t in tot.items():
        t["acceptance"] = round(t["accepted"] / max(1, t["drafted"]), 3)
        t["decode_tok_s"] = round(1000 * t["tokens"] / max(1e-9, t["decode_ms"]), 2)
    print(json.dumps(tot, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
