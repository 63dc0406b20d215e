"""int4 quality of the builder's weight-quantization methods against the fp32 builder graph of the same
model: top-1 agreement and mean overlap on held-out text (export/quality.py), plus the graph's size and
its 1-token and 3-token forward times (2 threads) from one interleaved run.

    python benchmarks/int4_quality.py --model qwen2.5-coder-1.5b --algos rtn,k_quant,rtn_last \
        [--tokens 512] [--json out/int4-quality.json]

Builds are cached like export's (a second run only measures).
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import numpy as np


def step_ms(path: Path, k: int, threads: int = 2, n: int = 10) -> float:
    from edgespec.runtime.engine.kv import ModelRunner
    from edgespec.runtime.engine.sessions import create_session

    sess, _ = create_session(path, "cpu", threads=threads)
    r = ModelRunner(sess, "target", exact=False)
    r.forward(np.random.default_rng(0).integers(0, 1000, 200).tolist())
    times = []
    for _ in range(n):
        r.forward([5] * k)
        times.append(r.last_ms)
        r.crop(200)
    return statistics.median(times)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen2.5-coder-1.5b")
    ap.add_argument("--algos", default="rtn,k_quant,rtn_last")
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    from edgespec.export import builder as eb
    from edgespec.export.quality import quality_check
    from edgespec.export.sources import resolve

    src = resolve(args.model, progress=False)
    ref = eb.build_model(src.hf_dir, src.sha256, src.name, precision="fp32")
    rows = []
    for algo in args.algos.split(","):
        exp = eb.build_model(src.hf_dir, src.sha256, src.name, precision="int4", algo=algo)
        q = quality_check(ref.onnx, exp.onnx, src.hf_dir / "tokenizer.json", n_tokens=args.tokens)
        data = sum(f["bytes"] for f in exp.meta["files"].values())
        row = {"algo": algo, "top1_agreement": q["top1_agreement"], "mean_overlap": q["mean_overlap"],
               "bytes": data, "step_ms_k1": step_ms(exp.onnx, 1), "step_ms_k3": step_ms(exp.onnx, 3),
               "min_forward_tokens": (exp.meta.get("batch_invariance") or {}).get("min_forward_tokens")}
        rows.append(row)
        print(json.dumps(row), flush=True)
    print("| method | top-1 vs fp32 | mean overlap | files GB | 1-token ms | 3-token ms |")
    for r in rows:
        print(f"| {r['algo']} | {r['top1_agreement']:.3f} | {r['mean_overlap']:.3f} | {r['bytes'] / 1e9:.2f} | "
              f"{r['step_ms_k1']:.1f} | {r['step_ms_k3']:.1f} |")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
