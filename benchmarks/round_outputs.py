"""The deterministic outputs of every strategy on one bundle, as canonical JSON (a refactor's byte-identity check).

    python benchmarks/round_outputs.py --bundle bundles/smollm-self-serve [--json OUT]

For each strategy the bundle can serve (one whose check refuses the bundle is listed as skipped, with
its one-line reason), each fixed draft length, greedy and sampled (temperature 0.8, seed 1234), and
tli/sd with randomised drafting (draft_probability 0.6) and tli with a 16-position drafter window, every prompt's token ids, text, drafted and
accepted counts and stop reason are written; nothing timed. draft_length="auto" is left out: its
governor chooses gamma from measured round times, so its drafted/accepted counts (and, sampled, its
tokens) depend on the machine's timing. Prints the sha256 of the JSON (sorted keys, no spaces).
Every configuration is a variant of one decoder (same sessions), run in a fixed order.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os

from edgespec.errors import EdgespecError
from edgespec.runtime.api.decoder import SpeculativeDecoder
from edgespec.runtime.round.strategies import STRATEGIES

PROMPTS = (
    "The capital of France is",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "Repeat exactly: the quick brown fox jumps over the lazy dog. the quick brown fox",
    "List three colours of the rainbow:\n1.",
    "Once upon a time, in a small village by the sea,",
    "Translate to French: Good morning, how are you?\nFrench:",
)
DRAFT_LENGTHS = (1, 3, 5)
SAMPLED = {"temperature": 0.8, "seed": 1234}
RANDOMISED = 0.6
MAX_NEW = 40


def configurations():
    for name in sorted(STRATEGIES):
        lengths = DRAFT_LENGTHS if STRATEGIES[name].speculative else (1,)
        for k in lengths:
            yield name, k, None
            if name in ("tli", "sd"):
                yield name, k, RANDOMISED
    yield "tli", 3, "window"        # a 16-position drafter window: refills every few rounds (context.DrafterWindow)


def run(bundle: str, threads: int = 1) -> dict:
    base = SpeculativeDecoder(bundle, strategy="tli", draft_length=1, threads=threads)
    out: dict = {"skipped": {}, "runs": []}
    for name, k, a in configurations():
        key = f"{name}/k={k}" + (f"/a={a}" if isinstance(a, float) else "/window=16" if a else "")
        try:
            if a == "window":
                dec = base.variant(name, draft_length=k, drafter_window=16)
            else:
                dec = base.variant(name, draft_length=k, draft_probability=a)
        except EdgespecError as e:
            out["skipped"][key] = str(e)
            continue
        for mode, kw in (("greedy", {}), ("sampled", SAMPLED)):
            for i, prompt in enumerate(PROMPTS):
                r = dec.generate(prompt, max_new_tokens=MAX_NEW, **kw)
                out["runs"].append({"config": key, "mode": mode, "prompt": i, "ids": r.token_ids, "text": r.text,
                                    "drafted": r.stats.drafted, "accepted": r.stats.accepted,
                                    "stop": r.stats.stop_reason})
    base.close()
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bundle", default=os.environ.get("EDGESPEC_SMOLLM_BUNDLE", "bundles/smollm-self-serve"))
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    data = json.dumps(run(args.bundle, args.threads), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            f.write(data)
    print(hashlib.sha256(data.encode("utf-8")).hexdigest(), f"{len(json.loads(data)['runs'])} runs")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
