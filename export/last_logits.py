"""Logits for the last positions only: a `logits_to_keep` input in front of the LM head.

A prefill needs the logits of its last position, yet a graph that emits logits for every position
runs the LM head (about 15% of Qwen2.5-1.5B's work per token) over the whole prompt and writes a
[S, V] float tensor (410 MB for 671 tokens at V = 151,936). llama.cpp computes only the last row.

The edit: the hidden state that feeds the head MatMul (found structurally, export/graph_info.py
`find_head`) goes through `Slice(h, starts=-k, ends=MAX, axes=[1])`, where k is the new graph input
`logits_to_keep` (int64 [1]); k = 0 slices nothing (-0 = 0): every position's logits, as before.
runtime/kv.py feeds it on every forward (k at prefill, 0 otherwise) and any graph without it still
runs. It is a required input, not an overridable initializer with a default of 0: ORT's IOBinding,
which the shared KV cache needs, refuses to bind an overridable initializer ("Failed to find NodeArg").
onnxruntime-genai's generator does not feed it, so `strip_logits_to_keep` gives it the graph as the
builder wrote it (bench --peers).

Rows are computed by the same head kernel whatever k is, as long as k >= 2 on graphs whose 1-row
MatMulNBits path differs (runtime/kv.py keeps `min_forward_tokens` rows for that reason).
"""
from __future__ import annotations

import os

import numpy as np

from edgespec.errors import ExportError
from edgespec.export.graph_info import find_head, logits_dims_after_head_edit

LOGITS_TO_KEEP = "logits_to_keep"
_MAX = np.iinfo(np.int64).max


def add_logits_to_keep(model) -> bool:
    """Edit an onnx.ModelProto in place; False if it already has the input (nothing done)."""
    from onnx import TensorProto, helper, numpy_helper  # lazy: onnx is the [export] extra

    graph = model.graph
    if any(i.name == LOGITS_TO_KEEP for i in graph.input):
        return False
    head, *_rest, path = find_head(graph)
    hidden = head.input[0]
    names = {LOGITS_TO_KEEP, *(f"edgespec/last_logits/{s}" for s in ("starts", "ends", "axes", "out"))}
    taken = {o for n in graph.node for o in n.output} | {t.name for t in graph.initializer} | \
        {i.name for i in graph.input}
    if names & taken:
        raise ExportError(f"graph already uses a name edgespec needs for {LOGITS_TO_KEEP}: {sorted(names & taken)}")
    p = "edgespec/last_logits/"
    # Constant nodes, not initializers: the manifest's weight statistics count initializers.
    consts = [helper.make_node("Constant", [], [p + name], name=p + name + "_const",
                               value=numpy_helper.from_array(np.array([v], np.int64), name))
              for name, v in (("ends", _MAX), ("axes", 1))]
    graph.input.append(helper.make_tensor_value_info(LOGITS_TO_KEEP, TensorProto.INT64, [1]))
    neg = helper.make_node("Neg", [LOGITS_TO_KEEP], [p + "starts"], name=p + "neg")
    cut = helper.make_node("Slice", [hidden, p + "starts", p + "ends", p + "axes"], [p + "out"], name=p + "slice")
    at = list(graph.node).index(head)
    for node in reversed([*consts, neg, cut]):
        graph.node.insert(at, node)
    head.input[0] = p + "out"
    # The head's output and everything between it and `logits` now has k rows, not the input's length.
    dims = logits_dims_after_head_edit(graph, head, path)
    if len(dims) >= 2:
        dims[1].ClearField("dim_value")
        dims[1].dim_param = "logits_length"
    return True


def strip_logits_to_keep(model) -> bool:
    """Undo `add_logits_to_keep` in place (the head reads the hidden state again); False if absent."""
    graph = model.graph
    if not any(i.name == LOGITS_TO_KEEP for i in graph.input):
        return False
    p = "edgespec/last_logits/"
    cut = next(n for n in graph.node if n.name == p + "slice")
    for n in graph.node:
        for j, name in enumerate(n.input):
            if name == p + "out":
                n.input[j] = cut.input[0]
    for n in [n for n in graph.node if n.name.startswith(p)]:
        graph.node.remove(n)
    graph.input.remove(next(i for i in graph.input if i.name == LOGITS_TO_KEEP))
    return True


def edit_file(path, out_path=None) -> bool:
    """Apply the edit to a model file (its external data stays where it is: only the graph file is
    rewritten, at `out_path` beside the same data). False if the graph already had the input."""
    import onnx  # lazy: onnx is the [export] extra

    model = onnx.load(str(path), load_external_data=False)
    changed = add_logits_to_keep(model)
    if changed or out_path is not None:
        dst = str(out_path or path)
        onnx.save_model(model, dst + ".tmp")
        os.replace(dst + ".tmp", dst)       # a new file: never writes through a hard link into the export cache
    return changed
