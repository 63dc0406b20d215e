"""The target's prefill graph: the same graph with MatMulNBits computing in fp32 (accuracy_level 1).

An int4 graph for the CPU EP computes with int8 activations (accuracy_level 4): the fastest decode
step, but on a long prompt ORT's int8 path with 32-weight blocks runs below its fp32 path. On the
Qwen2.5-Coder 1.5B, 2-core Xeon (AVX-512), a 512-token prefill took 6.51 s at level 4 and 5.23 s at
level 1 (llama.cpp pp512: 4.91 s), while a 2-token step took 69 ms at level 4 and 276 ms at level 1.
So the runtime may run long forwards (prompts) through this graph and everything else through
model.onnx (`SpeculativeDecoder(prefill_graph=True)`, runtime/engine/kv.py). The two graphs share the
weight file (`model.onnx.data`), the inputs, the outputs and the KV layout; their logits differ by
the activation rounding only (0.19 at the last position of 512 random tokens on the 1.5B), and greedy
speculation stays identical to greedy `ar` because both prefill through the same graph.

Written beside model.onnx as `prefill.onnx` (a few hundred KB) for graphs with MatMulNBits at a
level other than 1; an older bundle has none, and `prefill_graph=True` then says so. Where the bundle
has a padded-attention graph (export/padded_attention.py), the runtime's graph, it is made from that
one, so that both sessions feed and write the KV cache alike.
"""
from __future__ import annotations

from pathlib import Path

PREFILL_GRAPH = "prefill.onnx"
FP32_LEVEL = 1


def runtime_graph(target_dir: Path) -> Path:
    """The graph the runtime runs for the target: the padded-attention graph where there is one."""
    from edgespec.export.padded_attention import PADDED_GRAPH

    padded = Path(target_dir) / PADDED_GRAPH
    return padded if padded.is_file() else Path(target_dir) / "model.onnx"


def write_prefill_graph(target_dir: Path) -> Path | None:
    """Write target_dir/prefill.onnx from target_dir/model.onnx; None (nothing written) when the graph
    has no MatMulNBits computing at another level than fp32."""
    import onnx  # lazy: the [export] extra

    model = onnx.load(str(runtime_graph(target_dir)), load_external_data=False)
    changed = 0
    for node in (n for n in model.graph.node if n.op_type == "MatMulNBits"):
        for attr in node.attribute:
            if attr.name == "accuracy_level" and attr.i not in (0, FP32_LEVEL):   # 0, unset: fp32 already
                attr.i = FP32_LEVEL
                changed += 1
    if not changed:
        return None
    out = Path(target_dir) / PREFILL_GRAPH
    onnx.save_model(model, str(out))     # the initializers keep their external locations: the same data file
    return out


def check_prefill_graph(target_dir: Path, vocab_size: int) -> float:
    """Run the runtime's graph and the prefill graph (prepacked, one at a time, through the runtime's
    runner) on the export's check input in one forward: the prefill graph must load, run and give
    finite logits of the graph's shape. Returns the max |diff| of their logits (recorded, not judged:
    it is the activations' rounding)."""
    import gc

    import numpy as np

    from edgespec.errors import ExportError
    from edgespec.export.onnx_export import check_inputs, ort_session
    from edgespec.runtime.engine.kv import ModelRunner

    ids = check_inputs(vocab_size)[0]
    logits = []
    for path in (runtime_graph(target_dir), Path(target_dir) / PREFILL_GRAPH):
        try:
            runner = ModelRunner(ort_session(path, prepack=True), "check")
            logits.append(runner.forward(ids).copy())
        except Exception as exc:  # ORT raises its own types for a graph it cannot load or run
            raise ExportError(f"the target's {path.name} does not run on the CPU EP: {type(exc).__name__}: "
                              f"{str(exc).splitlines()[0][:200]}") from exc
        del runner
        gc.collect()
    if logits[1].shape != logits[0].shape or not np.isfinite(logits[1]).all():
        raise ExportError(f"the target's prefill graph gave logits of shape {logits[1].shape} (graph: "
                          f"{logits[0].shape}) or non-finite values; no bundle written")
    return float(np.abs(logits[1] - logits[0]).max())


def write_and_check(target_dir: Path, vocab_size: int) -> float | None:
    """write_prefill_graph, then check_prefill_graph; None where no prefill graph is written."""
    return None if write_prefill_graph(target_dir) is None else check_prefill_graph(target_dir, vocab_size)
