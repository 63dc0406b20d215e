"""Logits for the last positions only: a `logits_to_keep` input in front of the LM head.

A prefill needs the logits of its last position, yet a graph that emits logits for every position
runs the LM head (about 15% of Qwen2.5-1.5B's work per token) over the whole prompt and writes a
[S, V] float tensor (410 MB for 671 tokens at V = 151,936). llama.cpp computes only the last row.

The edit: the hidden state that feeds the head MatMul (found structurally, export/graph_info.py
`find_head`) goes through `Slice(h, starts=-k, ends=MAX, axes=[1])`, where k is the new graph input
`logits_to_keep` (int64 [1]); k = 0 slices nothing (-0 = 0): every position's logits, as before.
runtime/engine/kv.py feeds it on every forward (k at prefill, 0 otherwise) and any graph without it still
runs. It is a required input, not an overridable initializer with a default of 0: ORT's IOBinding,
which the shared KV cache needs, refuses to bind an overridable initializer ("Failed to find NodeArg").
onnxruntime-genai's generator does not feed it, so `strip_logits_to_keep` gives it the graph as the
builder wrote it (bench --peers).

Rows are computed by the same head kernel whatever k is, as long as k >= 2 on graphs whose 1-row
MatMulNBits path differs (runtime/engine/kv.py keeps `min_forward_tokens` rows for that reason).

Since 2026-11-27 the rows are cut earlier where the graph allows it: right after the last layer's
attention (a builder graph's GroupQueryAttention), on its output and on the residual stream beside it
(`_last_layer_cut`). Attention still sees every position and writes every position's KV; the last
layer's output projection, its MLP, the norms and the head then run on k rows only (on the 1.5B,
3.3% of a long prefill's matrix work). Every op between the cut and the head is row-wise (an allow
list), so the kept rows get the same bits as before as long as k meets the kernels' minimum (above).
Graphs where that cannot be proved (no attention op, a reshape in the way) keep the cut before the head.
"""
from __future__ import annotations

import os

import numpy as np

from edgespec.errors import ExportError
from edgespec.export.graph_info import find_head, logits_dims_after_head_edit

LOGITS_TO_KEEP = "logits_to_keep"
_MAX = np.iinfo(np.int64).max


ATTENTION_OPS = {"GroupQueryAttention", "MultiHeadAttention", "Attention", "PagedAttention"}
# Ops that compute each position's row from that row alone (plus constants).
ROW_WISE_OPS = {"MatMulNBits", "MatMul", "Add", "Sub", "Mul", "Div", "Sigmoid", "Tanh", "Relu", "Erf", "Gelu",
                "FastGelu", "QuickGelu", "BiasGelu", "Softplus", "Cast", "Identity", "Pow", "Sqrt",
                "Reciprocal", "SimplifiedLayerNormalization", "SkipSimplifiedLayerNormalization",
                "LayerNormalization", "SkipLayerNormalization"}
_PREFIX = "edgespec/last_logits/"


def _last_layer_cut(graph, head) -> tuple[list[str], list] | None:
    """(tensors to cut, the nodes that read them) so that everything after the last attention runs on
    the kept rows: the attention's (unpadded) output and the residual stream that meets it; None where
    the nodes between it and the head's input are not all row-wise, feed anything but the head, or read
    a tensor from before the cut that a row-wise node did not make (a per-position table, say)."""
    hidden = head.input[0]
    nodes = list(graph.node)
    producers = {o: n for n in nodes for o in n.output if o}
    consumers: dict[str, list] = {}
    for n in nodes:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    constant = {t.name for t in graph.initializer} | {n.output[0] for n in nodes if n.op_type == "Constant"}
    upstream, todo = set(), [hidden]           # nodes `hidden` depends on, back to the last attention
    while todo:
        node = producers.get(todo.pop())
        if node is None or id(node) in upstream or node.op_type in ATTENTION_OPS:
            continue
        upstream.add(id(node))
        todo.extend(i for i in node.input if i and i not in constant)
    attention = [n for n in nodes if n.op_type in ATTENTION_OPS and
                 any(id(c) in upstream for c in consumers.get(n.output[0], []))]
    if not attention:
        return None
    start = attention[-1].output[0]              # the last layer's (ONNX keeps nodes in topological order)
    while len(consumers.get(start, [])) == 1 and consumers[start][0].op_type == "Slice":
        start = consumers[start][0].output[0]    # the padded-attention graph's unpad slice (padded_attention.py)
    downstream, todo = set(), [start]
    while todo:
        for node in consumers.get(todo.pop(), []):
            if id(node) not in downstream:
                downstream.add(id(node))
                todo.extend(o for o in node.output if o)
    between = [n for n in nodes if id(n) in upstream and id(n) in downstream]
    inside = {id(n) for n in between}
    graph_outputs = {o.name for o in graph.output}
    cut = []
    for node in between:
        if node.op_type not in ROW_WISE_OPS:
            return None
        if node.op_type in ("MatMul", "MatMulNBits") and any(i and i not in constant for i in node.input[1:]):
            return None                          # a product of two activations is not row-wise
        for name in node.input:
            if name and name not in constant and name not in cut and \
                    (name == start or id(producers.get(name)) not in inside):
                if name != start and getattr(producers.get(name), "op_type", None) not in ROW_WISE_OPS:
                    return None
                cut.append(name)
        for out in filter(None, node.output):
            readers = [c for c in consumers.get(out, []) if id(c) not in inside]
            if out in graph_outputs or any(c is not head for c in readers) or (readers and out != hidden):
                return None
    return (cut, between) if start in cut else None


def add_logits_to_keep(model) -> bool:
    """Edit an onnx.ModelProto in place; False if it already has the input (nothing done)."""
    from onnx import TensorProto, helper, numpy_helper  # lazy: onnx is the [export] extra

    graph = model.graph
    if any(i.name == LOGITS_TO_KEEP for i in graph.input):
        return False
    head, *_rest, path = find_head(graph)
    hidden = head.input[0]
    cut, readers = _last_layer_cut(graph, head) or ([hidden], [head])
    p = _PREFIX
    names = {LOGITS_TO_KEEP, *(p + s for s in ("starts", "ends", "axes")), *(f"{p}out{j}" for j in range(len(cut)))}
    taken = {o for n in graph.node for o in n.output} | {t.name for t in graph.initializer} | \
        {i.name for i in graph.input}
    if names & taken:
        raise ExportError(f"graph already uses a name edgespec needs for {LOGITS_TO_KEEP}: {sorted(names & taken)}")
    # Constant nodes, not initializers: the manifest's weight statistics count initializers.
    consts = [helper.make_node("Constant", [], [p + name], name=p + name + "_const",
                               value=numpy_helper.from_array(np.array([v], np.int64), name))
              for name, v in (("ends", _MAX), ("axes", 1))]
    graph.input.append(helper.make_tensor_value_info(LOGITS_TO_KEEP, TensorProto.INT64, [1]))
    neg = helper.make_node("Neg", [LOGITS_TO_KEEP], [p + "starts"], name=p + "neg")
    slices = [helper.make_node("Slice", [name, p + "starts", p + "ends", p + "axes"], [f"{p}out{j}"],
                               name=f"{p}slice{j}") for j, name in enumerate(cut)]
    nodes = list(graph.node)
    for node in readers:                         # the nodes after the cut read the kept rows
        for j, name in enumerate(node.input):
            if name in cut:
                node.input[j] = f"{p}out{cut.index(name)}"
    at = min(nodes.index(n) for n in readers)
    for node in reversed([*consts, neg, *slices]):
        graph.node.insert(at, node)
    # Everything from the cut to `logits` now has k rows, not the input's length.
    stale = {o for n in readers for o in n.output}
    for vi in list(graph.value_info):
        if vi.name in stale:
            graph.value_info.remove(vi)
    dims = logits_dims_after_head_edit(graph, head, path)
    if len(dims) >= 2:
        dims[1].ClearField("dim_value")
        dims[1].dim_param = "logits_length"
    return True


def strip_logits_to_keep(model) -> bool:
    """Undo `add_logits_to_keep` in place (every cut reads its source again); False if absent."""
    graph = model.graph
    if not any(i.name == LOGITS_TO_KEEP for i in graph.input):
        return False
    sources = {n.output[0]: n.input[0] for n in graph.node if n.name.startswith(_PREFIX) and n.op_type == "Slice"}
    for n in graph.node:
        for j, name in enumerate(n.input):
            if name in sources:
                n.input[j] = sources[name]
    for n in [n for n in graph.node if n.name.startswith(_PREFIX)]:
        graph.node.remove(n)
    graph.input.remove(next(i for i in graph.input if i.name == LOGITS_TO_KEEP))
    return True


def edit_file(path, out_path=None) -> bool:
    """Apply the edit to a target's model file, with the graph's greedy ids (export/greedy_ids.py): its
    external data stays where it is (only the graph file is rewritten, at `out_path` beside the same
    data). False if the graph already had both."""
    import onnx  # lazy: onnx is the [export] extra

    from edgespec.export.greedy_ids import add_greedy_ids

    model = onnx.load(str(path), load_external_data=False)
    changed = add_logits_to_keep(model)
    changed = add_greedy_ids(model) or changed
    if changed or out_path is not None:
        dst = str(out_path or path)
        onnx.save_model(model, dst + ".tmp")
        os.replace(dst + ".tmp", dst)       # a new file: never writes through a hard link into the export cache
    return changed
