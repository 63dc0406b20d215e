"""Runtime-core numbers for a bundle (not a test): ar vs tli at several draft lengths, greedy, one run,
configurations interleaved per prompt, held-out HumanEval prompts (the calibration split is excluded).

    .venv/bin/python tests/measure_runtime.py BUNDLE [--prompts 20] [--tokens 128] [--draft-lengths 2,4,6]
                                              [--threads N] [--strategy tli]

Prints acceptance, tau, wall-clock speedup over ar, the target's verify-(k+1)/decode-1 time ratio
(medians of the per-forward times in GenerationStats.verify_ms_by_k), the drafter step / decode-1
ratio (c), the overhead share of the decode phase, and where the time goes; and whether every
speculative output was token-identical to ar."""
from __future__ import annotations

import argparse

import numpy as np

from edgespec.calibrate.prompts import load_prompts
from edgespec.runtime import Bundle, SpeculativeDecoder


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("bundle")
    ap.add_argument("--prompts", type=int, default=20)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--draft-lengths", default="2,4,6")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--strategy", default="tli")
    args = ap.parse_args()
    ks = [int(k) for k in args.draft_lengths.split(",")]
    b = Bundle.load(args.bundle, verify="fast")
    base = SpeculativeDecoder(b, strategy=args.strategy, draft_length=ks[0], threads=args.threads)
    decs = {"ar": base.variant("ar"), **{k: base.variant(draft_length=k) for k in ks}}
    for d in decs.values():
        d.generate("def f(x):", max_new_tokens=8)                 # warm-up, not recorded
    stats = {k: [] for k in decs}
    identical = {k: 0 for k in decs}
    prompts = load_prompts("humaneval", split="test")[: args.prompts]
    for p in prompts:
        ref = None
        for k, d in decs.items():
            r = d.generate(p.text, max_new_tokens=args.tokens)
            ref = r.token_ids if k == "ar" else ref
            identical[k] += r.token_ids == ref
            stats[k].append(r.stats)
        print(p.id, " ".join(f"{k}:{stats[k][-1].total_ms / 1e3:.1f}s" for k in decs), flush=True)

    def total(k, f):
        return sum(getattr(s, f) for s in stats[k])

    def share(k):
        return total(k, "overhead_ms") / (total(k, "total_ms") - total(k, "prefill_ms"))

    dec1 = float(np.median([x for s in stats["ar"] for x in s.verify_ms_by_k.get(1, [])]))
    ar_ms = total("ar", "total_ms")
    print(f"\nbundle {args.bundle}: {len(prompts)} prompts x {args.tokens} tokens, threads {base.shared.target_session_info.threads}")
    print(f"ar: {total('ar', 'new_tokens')} tokens in {ar_ms / 1e3:.1f} s, decode-1 median {dec1:.1f} ms, "
          f"overhead share {share('ar'):.3f}")
    for k in ks:
        drafted, accepted = total(k, "drafted"), total(k, "accepted")
        tau = (total(k, "new_tokens") - total(k, "prefill_tokens")) / total(k, "verify_forwards")
        vk = float(np.median([x for s in stats[k] for x in s.verify_ms_by_k.get(k + 1, [])] or [np.nan]))
        step = float(np.median([x for s in stats[k] for x in s.draft_ms_steps] or [np.nan]))
        ms = total(k, "total_ms")
        print(f"{args.strategy} k={k}: identical {identical[k]}/{len(prompts)}, acceptance {accepted / drafted:.3f}, "
              f"tau {tau:.2f}, speedup {ar_ms / ms:.2f}x, verify-{k + 1}/decode-1 {vk / dec1:.2f}, "
              f"draft step {step:.1f} ms (c {step / dec1:.2f}), overhead share {share(k):.3f}; "
              f"prefill {total(k, 'prefill_ms') / 1e3:.1f} s, draft {total(k, 'draft_ms') / 1e3:.1f} s, "
              f"verify {total(k, 'verify_ms') / 1e3:.1f} s, overhead {total(k, 'overhead_ms') / 1e3:.2f} s, "
              f"resyncs {total(k, 'drafter_resyncs')}")


if __name__ == "__main__":
    main()
