"""Peer measurement: transformers' assisted generation (torch, CPU) on the prompts `edgespec bench` uses.

Not part of the package and not run in CI (it needs the [export] extra and the pulled models). It prints
one JSON line per (threads, mode) with tokens/s, so the closing note can put it beside `edgespec bench`:

    .venv/bin/python benchmarks/peer_transformers.py --pair qwen-coder --limit 6 --max-new-tokens 64 \
        --threads 1,2 --out out/peer-transformers.json

Greedy; per prompt, the target alone and then target + assistant (interleaved, so drift hits both);
one untimed warm-up generation per mode. tokens/s = generated tokens / wall time, prefill included,
as `tokens_per_s` in edgespec's report.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pair", default="qwen-coder")
    ap.add_argument("--prompts", default="humaneval")
    ap.add_argument("--split", default="test")
    ap.add_argument("--limit", type=int, default=6)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--threads", default="1,2", help="comma-separated torch thread counts to try")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from edgespec.calibrate.prompts import load_prompts
    from edgespec.models import get_pair
    from edgespec.paths import models_dir

    pair = get_pair(args.pair)
    tdir, ddir = models_dir() / pair.target, models_dir() / pair.drafter
    tok = AutoTokenizer.from_pretrained(tdir)
    target = AutoModelForCausalLM.from_pretrained(tdir, dtype=torch.float32).eval()
    drafter = AutoModelForCausalLM.from_pretrained(ddir, dtype=torch.float32).eval()
    prompts = [p for p in load_prompts(args.prompts, args.split) if p.text.strip()][: args.limit]
    encoded = [tok(p.text, return_tensors="pt") for p in prompts]

    def run(enc, assisted: bool, max_new: int) -> tuple[int, float]:
        kw = dict(max_new_tokens=max_new, do_sample=False, pad_token_id=tok.eos_token_id)
        if assisted:
            kw["assistant_model"] = drafter
        t0 = time.perf_counter()
        with torch.no_grad():
            out = target.generate(**enc, **kw)
        return int(out.shape[1] - enc["input_ids"].shape[1]), time.perf_counter() - t0

    results = []
    for threads in [int(t) for t in args.threads.split(",")]:
        torch.set_num_threads(threads)
        for assisted in (False, True):
            run(encoded[0], assisted, 8)                      # warm-up
        totals = {False: [0, 0.0, []], True: [0, 0.0, []]}
        for enc in encoded:
            for assisted in (False, True):
                n, dt = run(enc, assisted, args.max_new_tokens)
                totals[assisted][0] += n
                totals[assisted][1] += dt
                totals[assisted][2].append(n / dt)
        plain = totals[False][0] / totals[False][1]
        for assisted in (False, True):
            n, dt, per = totals[assisted]
            row = {"peer": "transformers", "pair": args.pair, "mode": "assisted" if assisted else "target-alone",
                   "threads": threads, "prompts": len(encoded), "tokens": n, "seconds": round(dt, 2),
                   "tokens_per_s": round(n / dt, 3), "median_prompt_tokens_per_s": round(statistics.median(per), 3),
                   "speedup_vs_target_alone": round((n / dt) / plain, 3),
                   "versions": {"torch": torch.__version__, "transformers": __import__("transformers").__version__}}
            print(json.dumps(row), flush=True)
            results.append(row)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
