"""Second chat turns: time to first token with prefix reuse against a cold call on the same full
conversation, interleaved, same decoder settings (the API defaults), greedy.

    python benchmarks/chat_turns.py --bundle bundles/qwen-coder-int4 --prompts benchmarks/heldout13.jsonl \
        --categories rag,summarization,extraction --threads 2 --max-new-tokens 64 [--prefill-graph auto|on|off] [--json OUT]

Per prompt: turn 1 = the prompt; turn 2 = turn 1 + the assistant's answer + a follow-up question. The
warm decoder answers turn 1 then turn 2 (reusing the KV of turn 1's prompt and answer); a cold decoder
(prefix_reuse=False, same sessions) answers turn 2 from scratch. Both turn-2 answers must be the same
tokens. Prints per prompt TTFT warm / cold and the ratio, and the median ratio.
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

FOLLOW_UP = "Thanks. Now give the three most important points as a short bulleted list."


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bundle", required=True)
    ap.add_argument("--prompts", default="benchmarks/heldout13.jsonl")
    ap.add_argument("--categories", default="rag,summarization,extraction")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--prefill-graph", choices=["auto", "on", "off"], default="auto",
                    help="SpeculativeDecoder(prefill_graph=...): auto (default), on, off")
    ap.add_argument("--json")
    args = ap.parse_args(argv)

    from edgespec.calibrate.prompts import load_prompts
    from edgespec.runtime import Bundle, SpeculativeDecoder
    from edgespec.runtime.api.config import PREFILL_GRAPH_SETTINGS

    bundle = Bundle.load(args.bundle, verify="fast")
    warm = SpeculativeDecoder(bundle, threads=args.threads, prefill_graph=PREFILL_GRAPH_SETTINGS[args.prefill_graph])
    cold = warm.variant(prefix_reuse=False)
    cats = set(args.categories.split(","))
    rows = []
    for p in [q for q in load_prompts(args.prompts, "all") if q.category in cats]:
        one = [{"role": "user", "content": p.text}]
        first = warm.generate(one, max_new_tokens=args.max_new_tokens, chat=True)
        two = one + [{"role": "assistant", "content": first.text}, {"role": "user", "content": FOLLOW_UP}]
        w = warm.generate(two, max_new_tokens=args.max_new_tokens, chat=True)
        c = cold.generate(two, max_new_tokens=args.max_new_tokens, chat=True)
        rows.append({"id": p.id, "prompt_tokens": w.stats.prompt_tokens, "reused": w.stats.reused_tokens,
                     "ttft_warm_ms": w.stats.ttft_ms, "ttft_cold_ms": c.stats.ttft_ms,
                     "ratio": w.stats.ttft_ms / c.stats.ttft_ms, "same_tokens": w.token_ids == c.token_ids})
        print(json.dumps(rows[-1]), flush=True)
    summary = {"prompts": len(rows), "median_ratio": statistics.median(r["ratio"] for r in rows),
               "max_ratio": max(r["ratio"] for r in rows), "same_tokens": sum(r["same_tokens"] for r in rows)}
    print(json.dumps(summary, indent=2))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"summary": summary, "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
