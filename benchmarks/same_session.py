"""Plain decoding's forms on ONE target session: the default decoder and its `ar-fast`, `ngram` and `ar`
variants, rows rotated per prompt. `edgespec bench` makes the drafting rows' session first, and on the
2-core Xeon (2026-11-27) the first session made ran 1-token steps 5-10% slower than a second one, which
biases a bench's ratios; here every row runs on the same session.

Per prompt: each row's decode rate (tokens after the first / time after the first) over `ar-fast`'s, the
strategy the default resolved to, and whether its tokens equal `ar-fast`'s; then the pooled rates.
With an injected device profile ($EDGESPEC_HOME/profiles) it shows what the plan does on another CPU class.

    python benchmarks/same_session.py --bundle B --prompts benchmarks/heldout13.jsonl --split test --threads 2
"""
from __future__ import annotations

import argparse

from edgespec.calibrate.prompts import load_prompts
from edgespec.runtime import SpeculativeDecoder


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bundle", required=True)
    for flag, default in (("--prompts", "benchmarks/heldout13.jsonl"), ("--split", "test"),
                          ("--max-new-tokens", 96), ("--threads", 2)):
        ap.add_argument(flag, default=default, type=type(default))
    args = ap.parse_args()
    prompts = load_prompts(args.prompts, args.split)
    auto = SpeculativeDecoder(args.bundle, threads=args.threads, options={"prefix_reuse": False, "answer_store_mb": 0})
    rows = {"auto": auto, "ar-fast": auto.variant("ar", plain_steps="fast"), "ngram": auto.variant("ngram"),
            "ar": auto.variant("ar")}
    print(auto.planning.current().describe(), flush=True)
    totals = {name: [0, 0.0] for name in rows}
    names = list(rows)
    for i, prompt in enumerate(prompts):
        out = {}
        for name in names[i % len(names):] + names[:i % len(names)]:
            result = rows[name].generate(prompt.text, max_new_tokens=args.max_new_tokens, chat=True)
            s = result.stats
            tokens, ms = s.new_tokens - s.prefill_tokens, s.total_ms - s.ttft_ms
            totals[name][0] += tokens
            totals[name][1] += ms
            out[name] = (tokens / ms, result.token_ids, s.strategy)
        base = out["ar-fast"][0]
        cells = " ".join(f"{name} {rate / base:.2f}" for name, (rate, _, _) in out.items())
        same = "equal" if out["auto"][1] == out["ar-fast"][1] else "differs"
        print(f"{prompt.id:18s} {cells}  (auto ran {out['auto'][2]}; its tokens {same} to ar-fast's)", flush=True)
    rate = {name: tokens / ms for name, (tokens, ms) in totals.items()}
    print("pooled decode rate vs ar-fast: " + ", ".join(f"{n} {r / rate['ar-fast']:.3f}" for n, r in rate.items()))


if __name__ == "__main__":
    main()
