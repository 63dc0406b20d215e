"""The target's greedy picks computed by the graph: `next_ids` = ArgMax(logits, axis=-1) and
`logits_sum` = ReduceSum(Cast(logits, float32), axis=-1), both [batch, rows].

On a GPU a greedy step needs k token ids, not k rows of logits (a Qwen2.5 row is 152k values, 300 KB
in fp16, copied to the host and argmaxed there every step); onnxruntime-genai's greedy search argmaxes
on the device too. The runtime (runtime/engine/kv.py, `forward(..., greedy=True)`) binds these two outputs
and leaves the logits on the device: ArgMax keeps the first of equal maxima, as NumPy's argmax does, so
the ids are those the host would pick; the row sum, in float32 so that an fp16 row cannot overflow it,
carries any NaN or inf of the row, which the runtime refuses as it refuses such logits. Graphs without
these outputs (bundles exported before 2026-11-28) argmax on the host; `strip_greedy_ids` gives the graph
back as the builder wrote it (onnxruntime-genai's generator, bench --peers).
"""
from __future__ import annotations

from edgespec.errors import ExportError
from edgespec.runtime.engine.kv_graph import LOGITS_SUM, NEXT_IDS

_PREFIX = "edgespec/greedy_ids/"


def add_greedy_ids(model) -> bool:
    """Edit an onnx.ModelProto in place; False if it already has the outputs (nothing done)."""
    from onnx import TensorProto, helper, numpy_helper  # lazy: onnx is the [export] extra
    import numpy as np

    graph = model.graph
    names = {o.name for o in graph.output}
    if NEXT_IDS in names:
        return False
    logits = next((o for o in graph.output if o.name == "logits"), None)
    if logits is None:
        raise ExportError("the target graph has no 'logits' output to take greedy ids from")
    taken = {o for n in graph.node for o in n.output} | {i.name for i in graph.input}
    if {NEXT_IDS, LOGITS_SUM} & taken:
        raise ExportError(f"the target graph already uses the names {NEXT_IDS!r} or {LOGITS_SUM!r}")
    dims = [d.dim_param or d.dim_value for d in logits.type.tensor_type.shape.dim][:-1] or ["batch", "rows"]
    p = _PREFIX
    graph.node.extend([
        helper.make_node("ArgMax", ["logits"], [NEXT_IDS], name=p + "argmax", axis=-1, keepdims=0, select_last_index=0),
        helper.make_node("Cast", ["logits"], [p + "logits_f32"], name=p + "cast", to=TensorProto.FLOAT),
        helper.make_node("Constant", [], [p + "axes"], name=p + "axes_const",
                         value=numpy_helper.from_array(np.array([-1], np.int64), "axes")),
        helper.make_node("ReduceSum", [p + "logits_f32", p + "axes"], [LOGITS_SUM], name=p + "sum", keepdims=0),
    ])
    graph.output.append(helper.make_tensor_value_info(NEXT_IDS, TensorProto.INT64, dims))
    graph.output.append(helper.make_tensor_value_info(LOGITS_SUM, TensorProto.FLOAT, dims))
    return True


def strip_greedy_ids(model) -> bool:
    """Undo `add_greedy_ids` in place; False if absent."""
    graph = model.graph
    if not any(o.name == NEXT_IDS for o in graph.output):
        return False
    for o in [o for o in graph.output if o.name in (NEXT_IDS, LOGITS_SUM)]:
        graph.output.remove(o)
    for n in [n for n in graph.node if n.name.startswith(_PREFIX)]:
        graph.node.remove(n)
    return True
