"""CUDA graphs and the graph's greedy ids on a GPU EP (issue 47), three checks that benchmarks/gpu_check.py
runs after its own:

1. `memcpy_nodes`: each target graph as ORT partitions it for the EP, saved optimized, and every Memcpy
   node in it with what it copies between (ORT refuses CUDA graph capture while any is left: docs/gpu.md);
2. `captured_against_uncaptured`: a decoder with `cuda_graph` "auto" (the target's steps captured) against
   one with "off": whether capture took, which widths were checked, `ar`'s greedy tokens both ways, and
   every strategy's captured output against `ar` uncaptured;
3. `plain_rates`: greedy plain decoding (`ar`), decode rate after the first token, interleaved over
   three rounds: edgespec uncaptured, edgespec captured, onnxruntime-genai's generator without and with
   its CUDA graphs (provider option `enable_cuda_graph`), on the same graph. benchmarks/gpu_scale.py does
   the same at the Qwen2.5-1.5B shape (`--scale`).
"""
from __future__ import annotations

import statistics
import tempfile
import warnings
from pathlib import Path

PROMPTS = ["def quicksort(items):", "The capital of France is", "Once upon a time, in a small village,",
           "import numpy as np\n\ndef mean(x):"]
STRATEGIES = ["auto", "ngram", "ngram-tli", "tli", "sd", "slem", "slrs1"]
NEW = 64


def memcpy_nodes(path: Path, ep: str) -> dict:
    """The Memcpy nodes ORT leaves in `path` for `ep`, each with the ops it copies from and to."""
    import onnx
    import onnxruntime as ort

    from edgespec.runtime.engine.sessions import resolve_providers

    with tempfile.TemporaryDirectory() as tmp:
        so = ort.SessionOptions()
        so.log_severity_level = 3
        so.optimized_model_filepath = str(Path(tmp) / "optimized.onnx")
        so.add_session_config_entry("session.optimized_model_external_initializers_file_name", "optimized.data")
        so.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes", "1024")
        ort.InferenceSession(str(path), so, providers=[p for p, _ in resolve_providers(ep)])
        model = onnx.load(str(Path(tmp) / "optimized.onnx"), load_external_data=False)
    producers = {o: n for n in model.graph.node for o in n.output}
    consumers: dict = {}
    for n in model.graph.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    rows = []
    for n in model.graph.node:
        if n.op_type.startswith("Memcpy"):
            src = producers.get(n.input[0])
            rows.append({"op": n.op_type, "tensor": n.input[0][:80],
                         "from": f"{src.op_type} {src.name[:60]}" if src is not None else "graph input",
                         "to": sorted({f"{c.op_type} {c.name[:60]}" for c in consumers.get(n.output[0], [])})[:4]})
    return {"memcpy": rows, "nodes": len(model.graph.node)}


def captured_against_uncaptured(bundle_path: Path, ep: str) -> dict:
    from edgespec.errors import EdgespecError
    from edgespec.runtime import Bundle, SpeculativeDecoder

    b = Bundle.load(bundle_path)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        captured = SpeculativeDecoder(b, "auto", ep=ep, options={"cuda_graph": "auto"})
        plain = SpeculativeDecoder(b, "auto", ep=ep, options={"cuda_graph": "off"})
    ref = {p: plain.variant("ar").generate(p, max_new_tokens=32, temperature=0.0).token_ids for p in PROMPTS}
    kv = captured.shared.target.kv
    rows = {}
    for strat in ["ar", *STRATEGIES]:
        try:
            dec = captured.variant(strat)
        except EdgespecError as exc:
            rows[strat] = f"n/a: {str(exc)[:100]}"
            continue
        equal = sum(dec.generate(p, max_new_tokens=32, temperature=0.0).token_ids == ref[p] for p in PROMPTS)
        rows[strat] = f"{equal}/{len(PROMPTS)}"
    return {"layout": type(kv).__name__, "capture": bool(getattr(kv, "capture", False)),
            "static": bool(getattr(kv, "static", False)), "checked_widths": sorted(getattr(kv, "checked", ())),
            "graph_argmax": captured.shared.target.graph_argmax, "equal_to_uncaptured_ar": rows,
            "said": [str(w.message)[:300] for w in said]}


def _edgespec_rate(dec, ids: list[int]) -> float:
    res = dec.generate(ids, max_new_tokens=NEW, temperature=0.0)
    st = res.stats
    return (st.new_tokens - 1) / max(1e-9, (st.total_ms - st.ttft_ms) / 1e3)


def genai_model(target_dir: Path, ep: str, cuda_graph: bool):
    """onnxruntime-genai's model on the bundle's target graph (profiler/peers.py's copy, logits_to_keep and
    the greedy ids stripped), its CUDA graphs on or off."""
    import onnxruntime_genai as og

    from edgespec.profiler.peers import GenaiPeer

    peer = GenaiPeer(target_dir, threads=None, ep=ep)
    config = og.Config(str(peer.root))
    config.clear_providers()
    config.append_provider(ep)
    if cuda_graph:
        config.set_provider_option(ep, "enable_cuda_graph", "1")
    return og.Model(config), peer


def plain_rates(bundle_path: Path, ep: str, rounds: int = 3) -> dict:
    import onnxruntime_genai as og
    from gpu_scale import _genai_plain      # benchmarks/ is on the path (gpu_check.py, or run from it)

    from edgespec.runtime import Bundle, SpeculativeDecoder

    b = Bundle.load(bundle_path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rows = {"edgespec": SpeculativeDecoder(b, "ar", ep=ep, options={"cuda_graph": "off"}),
                "edgespec_captured": SpeculativeDecoder(b, "ar", ep=ep, options={"cuda_graph": "auto"})}
    peers, errors = {}, {}
    for name, graphs in (("genai", False), ("genai_captured", True)):
        try:
            peers[name] = genai_model(b.target.onnx.parent, ep, graphs)
        except Exception as exc:  # noqa: BLE001 - a peer that cannot run is reported, not fatal
            errors[name] = f"{type(exc).__name__}: {str(exc)[:300]}"
    prompts = [b.target.tokenizer.encode(p).ids for p in PROMPTS]
    rates: dict = {k: [] for k in [*rows, *peers]}
    for _ in range(rounds):
        for ids in prompts:
            for name, dec in rows.items():
                rates[name].append(_edgespec_rate(dec, ids))
            for name, (model, _peer) in peers.items():
                rates[name].append(_genai_plain(model, og, ids))
    med = {k: round(statistics.median(v), 1) for k, v in rates.items() if v}
    out = {"decode_tok_s": med, "errors": errors}
    if "edgespec" in med:
        out["over_edgespec_uncaptured"] = {k: round(v / med["edgespec"], 3) for k, v in med.items()}
    return out


def run_all(bundles: dict, ep: str, say) -> None:
    from edgespec.runtime import Bundle

    for name, path in bundles.items():
        checks = (("memcpy", lambda: memcpy_nodes(Bundle.load(path).target.runtime_onnx, ep)),
                  ("captured", lambda: captured_against_uncaptured(path, ep)),
                  ("plain_rates", lambda: plain_rates(path, ep)))
        for label, check in checks:
            try:
                say(f"cuda_graphs/{label}/{name}", check())
            except Exception as exc:  # noqa: BLE001 - one failing check must not hide the others
                say(f"cuda_graphs/{label}/{name}", f"error: {type(exc).__name__}: {str(exc)[:600]}")


if __name__ == "__main__":          # a dry run on any machine: python benchmarks/gpu_graphs.py BUNDLE [EP]
    import json
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent))

    run_all({Path(sys.argv[1]).name: Path(sys.argv[1])}, sys.argv[2] if len(sys.argv) > 2 else "cpu",
            lambda k, v: print(k, json.dumps(v, default=str)[:1500], flush=True))
