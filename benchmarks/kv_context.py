"""Decode-step time against context length: the shared KV buffer (bound once, never copied) against the
copying cache (past fed as arrays, present returned as a fresh concatenation), on the same graph.

    python benchmarks/kv_context.py --bundle BUNDLE [--contexts 128,1024,1900,4096] [--threads 1] [--json OUT]

For each context n: prefill n random tokens, then time 1-token forwards (median of --steps), each
followed by a crop back to n, so every step sees the same context. `--optimum-bundle` adds the
optimum graph of the same model (the pre-builder layout) for a row of today's numbers.
Ratios are what to read: step(n) / step(first n), within one run.
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import numpy as np


def step_ms(runner, ctx: int, steps: int, rng) -> float:
    runner.reset()
    runner.forward(rng.integers(0, int(runner.vocab), ctx).tolist())
    times = []
    for _ in range(steps):
        runner.forward([int(rng.integers(0, int(runner.vocab)))])
        times.append(runner.last_ms)
        runner.crop(ctx)
    return statistics.median(times)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bundle", required=True)
    ap.add_argument("--optimum-bundle")
    ap.add_argument("--contexts", default="128,1024,1900,4096")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--steps", type=int, default=15)
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    from edgespec.runtime import Bundle
    from edgespec.runtime.engine.kv import ModelRunner
    from edgespec.runtime.engine.sessions import create_session

    ctxs = [int(c) for c in args.contexts.split(",")]
    layouts = {}
    b = Bundle.load(args.bundle, verify="fast")
    sess, _ = create_session(b.target.onnx, "cpu", threads=args.threads)
    shared = ModelRunner(sess, "target", exact=False)
    copying = ModelRunner(sess, "target", exact=False, kv="copy")
    layouts = {"shared": shared, "copy": copying} if shared.shared else {"copy": copying}
    if args.optimum_bundle:
        ob = Bundle.load(args.optimum_bundle, verify="fast")
        osess, _ = create_session(ob.target.onnx, "cpu", threads=args.threads)
        layouts["optimum-copy"] = ModelRunner(osess, "target", exact=False)
    rows = {name: {} for name in layouts}
    for ctx in ctxs:                              # interleaved: every layout at one context, then the next
        for name, runner in layouts.items():
            rows[name][ctx] = step_ms(runner, ctx, args.steps, np.random.default_rng(ctx))
        print(json.dumps({"context": ctx, **{n: round(r[ctx], 2) for n, r in rows.items()}}), flush=True)
    table = {n: {"ms": r, "ratio_to_first": {c: r[c] / r[ctxs[0]] for c in ctxs}} for n, r in rows.items()}
    print(f"| layout | " + " | ".join(f"{c} ctx ms (ratio)" for c in ctxs) + " |")
    for n, t in table.items():
        print(f"| {n} | " + " | ".join(f"{t['ms'][c]:.1f} ({t['ratio_to_first'][c]:.2f}x)" for c in ctxs) + " |")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"threads": args.threads, "bundle": args.bundle, "layouts": table}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
