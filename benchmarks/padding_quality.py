"""What padding 1-token steps buys: top-1 agreement with the fp32 graph of an int4 graph's decode steps
taken as 1-token forwards (plain_steps="fast", the path onnxruntime-genai runs) and as forwards padded
to the graph's min_forward_tokens (plain_steps="exact", the path every verify forward takes).

    python benchmarks/padding_quality.py --bundle bundles/qwen-coder-int4 \
        --reference ~/.cache/edgespec/onnx/<fp32 builder key>/model.onnx [--tokens 512] [--json OUT]

Held-out text: export/quality.py's (standard-library modules, not the benchmark prompts), teacher-forced
in segments: a 16-token prefill, then one decode step per token. The reference is the fp32 graph of the
same model, one prefill per segment. Also reports how often the two int4 paths disagree with each other.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

PREFIX = 16


def step_logits(runner, seq: np.ndarray, pad: bool) -> np.ndarray:
    runner.reset()
    runner.forward(seq[:PREFIX].tolist())
    rows = [runner.forward([int(t)], pad=pad)[0].copy() for t in seq[PREFIX:-1]]
    return np.stack(rows)          # logits predicting seq[PREFIX + 1:] ... aligned below


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bundle", required=True)
    ap.add_argument("--reference", required=True, help="the fp32 graph of the bundle's target model")
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json")
    args = ap.parse_args(argv)

    from edgespec.export.quality import _prefill_logits, held_out_ids
    from edgespec.runtime import Bundle
    from edgespec.runtime.engine.kv import ModelRunner
    from edgespec.runtime.engine.sessions import create_session

    bundle = Bundle.load(args.bundle, verify="fast")
    sess, _ = create_session(bundle.target.onnx, "cpu", args.threads, role="target")
    runner = ModelRunner(sess, "target", bundle.target.max_position)
    ref_sess, _ = create_session(args.reference, "cpu", args.threads, role="target")
    seqs = held_out_ids(Path(bundle.target.onnx).parent / "tokenizer.json", n_tokens=args.tokens)
    agree = {"fast": 0, "exact": 0, "fast_vs_exact": 0}
    n = 0
    for seq in seqs:
        if seq.size <= PREFIX + 2:
            continue
        ref = _prefill_logits(ref_sess, seq)[PREFIX:-1].argmax(-1)      # predicts seq[PREFIX + 1:]
        fast = step_logits(runner, seq, pad=False).argmax(-1)
        exact = step_logits(runner, seq, pad=True).argmax(-1)
        agree["fast"] += int((fast == ref).sum())
        agree["exact"] += int((exact == ref).sum())
        agree["fast_vs_exact"] += int((fast == exact).sum())
        n += ref.size
    out = {"positions": n, "min_forward_tokens": runner.min_tokens,
           "top1_vs_fp32_fast_1token": agree["fast"] / n, "top1_vs_fp32_exact_padded": agree["exact"] / n,
           "fast_equals_exact": agree["fast_vs_exact"] / n}
    print(json.dumps(out, indent=2))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
