"""How much a k-token forward (a speculative verify) costs relative to a 1-token decode step, per graph.

    python -m edgespec.profiler.verify_cost GRAPH_OR_BUNDLE [...] [--k 1,2,3,4,5,6,8] [--threads 1]
                                          [--past 200] [--repeats 15] [--json OUT]

A GRAPH is an .onnx file; a BUNDLE directory contributes its target/model.onnx. Every graph gets its
own ORT CPU session (intra-op threads as given, spinning off when > 1); each forward feeds k new
tokens after a random KV cache of `past` positions. Forwards are interleaved (repeat -> graph -> k)
so machine drift hits every cell alike, and the median is reported, in wall-clock ms and in process
CPU ms (less sensitive to other processes on a loaded machine). ratio(k) = median(k) / median(1):
about 1 means the verify is memory-bound (speculation pays), about k means compute-bound.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from edgespec.runtime.engine.kv import default_feeds
from edgespec.runtime.engine.sessions import session_options


def _session(path: Path, threads: int):
    import onnxruntime as ort  # lazy: like the runtime's sessions, loaded on use

    return ort.InferenceSession(str(path), sess_options=session_options(threads), providers=["CPUExecutionProvider"])


def _feeds(sess, k: int, past: int, rng) -> dict:
    ins = {i.name: i for i in sess.get_inputs()}
    f = {"input_ids": rng.integers(0, 100, (1, k), dtype=np.int64),   # valid in any vocabulary
         "attention_mask": np.ones((1, past + k), np.int64),
         "position_ids": np.arange(past, past + k, dtype=np.int64)[None]}
    for name, i in ins.items():
        if name.startswith("past_key_values."):
            f[name] = rng.standard_normal((1, int(i.shape[1]), past, int(i.shape[3]))).astype(np.float32)
    return {**{n: v for n, v in f.items() if n in ins}, **default_feeds(sess)}


def resolve(path: str) -> Path:
    p = Path(path)
    return p / "target" / "model.onnx" if p.is_dir() else p


def measure(paths: list[Path], ks: list[int], threads: int = 1, past: int = 200, repeats: int = 15) -> dict:
    rng = np.random.default_rng(0)
    sessions = {p: _session(p, threads) for p in paths}
    feeds = {(p, k): _feeds(sessions[p], k, past, rng) for p in paths for k in ks}
    wall = {key: [] for key in feeds}
    cpu = {key: [] for key in feeds}
    for key, f in feeds.items():  # warm-up
        sessions[key[0]].run(["logits"], f)
    for _ in range(repeats):
        for p in paths:
            for k in ks:
                t, c = time.perf_counter(), time.process_time()
                sessions[p].run(["logits"], feeds[(p, k)])
                wall[(p, k)].append(1e3 * (time.perf_counter() - t))
                cpu[(p, k)].append(1e3 * (time.process_time() - c))
    out = {}
    for p in paths:
        w = {k: float(np.median(wall[(p, k)])) for k in ks}
        c = {k: float(np.median(cpu[(p, k)])) for k in ks}
        out[str(p)] = {"threads": threads, "past": past, "repeats": repeats, "wall_ms": w, "cpu_ms": c,
                       "ratio_wall": {k: w[k] / w[ks[0]] for k in ks}, "ratio_cpu": {k: c[k] / c[ks[0]] for k in ks}}
    return out


def table(res: dict) -> str:
    lines = []
    for p, r in res.items():
        cells = "  ".join(f"k={k}: {r['wall_ms'][k]:.1f}/{r['cpu_ms'][k]:.1f} ms ({r['ratio_wall'][k]:.2f}/"
                          f"{r['ratio_cpu'][k]:.2f})" for k in r["wall_ms"])
        lines.append(f"{p} [{r['threads']} thr, wall/cpu]: {cells}")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("graphs", nargs="+", help=".onnx files or bundle directories (their target)")
    ap.add_argument("--k", default="1,2,3,4,5,6,8", help="new tokens per forward (the first is the baseline)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--past", type=int, default=200, help="KV-cache length before the forward")
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--json", type=Path, help="also write the results here")
    a = ap.parse_args(argv)
    res = measure([resolve(g) for g in a.graphs], [int(x) for x in a.k.split(",")], a.threads, a.past, a.repeats)
    print(table(res))
    if a.json:
        a.json.write_text(json.dumps(res, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
