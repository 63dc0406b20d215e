"""Whether the target's prefill graph gives the same bits for a prompt in one forward or in two, which
exact prefix reuse with `prefill_graph=True` relies on (runtime/engine/prefix.py).

    python benchmarks/prefill_chunks.py --bundle bundles/qwen-coder-int4 [--tokens 400] [--threads 2]

Runs N random tokens on the prefill graph in one forward, then split as k + (N - k) for several k,
and prints the largest difference of the last position's logits (0.0: bit for bit).
"""
from __future__ import annotations

import argparse

import numpy as np


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bundle", required=True)
    ap.add_argument("--tokens", type=int, default=400)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)

    from edgespec.runtime import Bundle
    from edgespec.runtime.engine.kv import ModelRunner
    from edgespec.runtime.engine.sessions import create_session

    b = Bundle.load(args.bundle, verify="fast")
    if b.target.prefill_onnx is None:
        raise SystemExit(f"edgespec: {args.bundle} has no target/prefill.onnx")
    graph = create_session(b.target.padded_onnx or b.target.onnx, "cpu", threads=args.threads)[0]
    twin = create_session(b.target.prefill_onnx, "cpu", threads=args.threads)[0]
    runner = ModelRunner(graph, "target", prefill_session=twin)
    n = args.tokens
    ids = np.random.default_rng(0).integers(0, min(b.target.vocab_size, 30000), n).tolist()
    runner.reset()
    whole = runner.forward(ids, last=1, prefill_graph=True)[-1].copy()
    for rest in (1, 2, 3, 5, 20, 50, n // 4, n // 2, 3 * n // 4):
        runner.reset()
        runner.forward(ids[:n - rest], last=1, prefill_graph=True)
        split = runner.forward(ids[n - rest:], last=1, prefill_graph=True)[-1]
        print(f"{n - rest} + {rest} tokens: max |logit difference| {float(np.abs(whole - split).max()):.3g}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
