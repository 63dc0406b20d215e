"""Drafter acceptance against its context window (`drafter_window`), greedy, fixed draft length.

    python benchmarks/window_sweep.py --bundle bundles/qwen-coder-int4 --prompts benchmarks/heldout13.jsonl \
        --split calib --windows 32,64,128,256,all --draft-length 3 --max-new-tokens 48 [--json OUT]

Per prompt the target prefills once (an `ar` call); every window then answers the same prompt on the
kept KV (prefix reuse), so the sweep costs decode time only. Acceptance = accepted / drafted over the
prompts; drafter fill tokens and time are what each window costs. Outputs must equal `ar`'s.
Choose the window on the calib split, report it on the test split.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bundle", required=True)
    ap.add_argument("--prompts", default="benchmarks/heldout13.jsonl")
    ap.add_argument("--split", default="calib")
    ap.add_argument("--windows", default="32,64,128,256,all")
    ap.add_argument("--strategy", default="tli")
    ap.add_argument("--draft-length", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json")
    args = ap.parse_args(argv)

    from edgespec.calibrate.prompts import load_prompts
    from edgespec.runtime import Bundle, SpeculativeDecoder

    bundle = Bundle.load(args.bundle, verify="fast")
    windows = [None if w == "all" else int(w) for w in args.windows.split(",")]
    base = SpeculativeDecoder(bundle, strategy=args.strategy, draft_length=args.draft_length, threads=args.threads)
    ar = base.variant("ar")
    decs = {w: base.variant(drafter_window=w) for w in windows}
    tot = {w: {"drafted": 0, "accepted": 0, "fill_tokens": 0, "fill_ms": 0.0, "draft_ms": 0.0, "differ": 0,
               "by_category": {}} for w in windows}
    for p in load_prompts(args.prompts, args.split):
        ref = ar.generate(p.text, max_new_tokens=args.max_new_tokens, chat=True)
        for w, dec in decs.items():
            r = dec.generate(p.text, max_new_tokens=args.max_new_tokens, chat=True)
            st, t = r.stats, tot[w]
            t["drafted"] += st.drafted
            t["accepted"] += st.accepted
            t["fill_tokens"] += st.draft_prefill_tokens
            t["fill_ms"] += st.draft_prefill_ms
            t["draft_ms"] += st.draft_ms
            t["differ"] += r.token_ids != ref.token_ids
            t["by_category"][p.category] = st.acceptance_rate
        print(json.dumps({"prompt": p.id, "tokens": ref.stats.prompt_tokens,
                          **{str(w): tot[w]["by_category"][p.category] for w in windows}}), flush=True)
    out = {str(w): {**t, "acceptance": t["accepted"] / max(1, t["drafted"])} for w, t in tot.items()}
    print(json.dumps({w: {k: v for k, v in o.items() if k != "by_category"} for w, o in out.items()}, indent=2))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
