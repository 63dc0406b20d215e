"""What an ONNX graph holds, read without its weights: every tensor, the IO names, and the parameter
count and bytes one decode forward reads. Shared by the exporters (onnx_export.py, builder.py), the
head pruner (prune.py) and the bundle writer."""
from __future__ import annotations

import numpy as np

from edgespec.errors import ExportError


def np_dtype(tensor) -> np.dtype:
    import onnx  # lazy: onnx is the [export] extra; `edgespec --help` imports this module

    return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type))


def all_tensors(model):
    """Every TensorProto of a model: initializers and node attributes (Constant values), subgraphs included."""
    from onnx.external_data_helper import _get_all_tensors  # lazy: onnx is the [export] extra

    return _get_all_tensors(model)


def io_names(path_or_model) -> dict:
    import onnx  # lazy: onnx is the [export] extra

    m = path_or_model if isinstance(path_or_model, onnx.ModelProto) else \
        onnx.load(str(path_or_model), load_external_data=False)
    inits = {t.name for t in m.graph.initializer}
    return {"inputs": [i.name for i in m.graph.input if i.name not in inits],
            "outputs": [o.name for o in m.graph.output]}


GATHER_DATA_INPUTS = {"Gather": (0,), "GatherBlockQuantized": (0, 2, 3)}   # table inputs read one row a token


def stored_bytes(tensor) -> int:
    """Bytes an initializer occupies as stored (packed int4 counts half a byte per value)."""
    import onnx  # lazy: onnx is the [export] extra

    if tensor.data_location == onnx.TensorProto.EXTERNAL:
        ext = {e.key: e.value for e in tensor.external_data}
        if "length" in ext:
            return int(ext["length"])
    if tensor.HasField("raw_data"):
        return len(tensor.raw_data)
    numel = int(np.prod([int(d) for d in tensor.dims])) if len(tensor.dims) else 1
    if tensor.data_type in (onnx.TensorProto.INT4, onnx.TensorProto.UINT4):
        return (numel + 1) // 2
    return numel * np_dtype(tensor).itemsize


def weight_stats(onnx_path_or_model) -> dict:
    """Parameters and the bytes one decode forward reads, for float and quantized graphs alike (the
    manifest's graph_params and bytes_per_forward, which MBSU reads).

    bytes_per_forward sums the stored size of every initializer, except that a table read only by
    gathers (an embedding: Gather data, or GatherBlockQuantized data/scales/zero points) counts one
    row, i.e. its size divided by the number of rows; a table read through a Transpose that only
    Gathers consume (ORT constant-folds it into an embedding table: the tied Gather(W^T) + head of
    builder and optimum graphs) counts one row of W^T, plus its full size when another op (the head)
    reads it too. A pruned head is already K columns wide.
    params counts logical weights: float tensors, MatMulNBits B as K*N, GatherBlockQuantized data by
    its logical shape, int8 MatMulInteger weights; not scales or zero points."""
    import onnx  # lazy: onnx is the [export] extra

    model = onnx_path_or_model if isinstance(onnx_path_or_model, onnx.ModelProto) else \
        onnx.load(str(onnx_path_or_model), load_external_data=False)
    graph = model.graph
    uses: dict[str, list] = {}
    for n in graph.node:
        for idx, name in enumerate(n.input):
            uses.setdefault(name, []).append((n, idx))
    gathered_transposes = {n.input[0] for n in graph.node if n.op_type == "Transpose" and uses.get(n.output[0])
                           and all(u.op_type == "Gather" and idx == 0 for u, idx in uses[n.output[0]])}
    floats = {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16}
    params = bytes_fwd = total = 0
    for t in graph.initializer:
        size = stored_bytes(t)
        total += size
        u = uses.get(t.name, [])
        gathered = bool(u) and len(t.dims) >= 1 and all(idx in GATHER_DATA_INPUTS.get(n.op_type, ()) for n, idx in u)
        if gathered and int(t.dims[0]):
            bytes_fwd += size // int(t.dims[0])
        elif len(t.dims) == 2 and t.name in gathered_transposes and int(t.dims[1]):
            others = any(n.op_type != "Transpose" for n, _ in u)
            bytes_fwd += (size if others else 0) + size // int(t.dims[1])
        else:
            bytes_fwd += size
        params += _logical_params(t, u, floats)
    return {"params": int(params), "bytes_per_forward": int(bytes_fwd), "initializer_bytes": int(total)}


def _logical_params(t, uses, floats) -> int:
    numel = int(np.prod([int(d) for d in t.dims])) if len(t.dims) else 1
    roles = {(n.op_type, idx) for n, idx in uses}
    if any(op == "MatMulNBits" and idx == 1 for op, idx in roles):
        node = next(n for n, idx in uses if n.op_type == "MatMulNBits")
        attrs = {a.name: a.i for a in node.attribute}
        return int(attrs.get("K", 0)) * int(attrs.get("N", 0))
    if any(idx >= 2 and op in ("MatMulNBits", "GatherBlockQuantized") for op, idx in roles):
        return 0  # scales, zero points
    if numel <= 1:
        return 0
    if t.data_type in floats or any(op == "GatherBlockQuantized" and idx == 0 for op, idx in roles):
        return numel
    if any(op in ("MatMulInteger", "DynamicQuantizeMatMul") and idx == 1 for op, idx in roles):
        return numel
    return 0


# Ops between the LM head MatMul and the `logits` output (soft-capping, scaling, casts).
PASS_THROUGH = {"Mul", "Div", "Tanh", "Cast", "Identity", "Add", "Sub", "Softcap"}


def find_head(graph) -> tuple:
    """(matmul node, weight initializer, layout, transpose node or None, bias initializer or None, path nodes).

    layout 'HV': logits = x @ W[H,V]; 'VH': logits = x @ E[V,H]^T (Transpose or Gemm transB=1)."""
    producers = {o: n for n in graph.node for o in n.output}
    inits = {t.name: t for t in graph.initializer}
    if "logits" not in producers:
        raise ExportError("graph has no node producing 'logits'")
    node = producers["logits"]
    path = []
    for _ in range(16):
        if node.op_type in ("MatMul", "Gemm", "MatMulNBits"):
            break
        if node.op_type not in PASS_THROUGH:
            raise ExportError(f"cannot find the LM head: 'logits' comes from {node.op_type} {node.name!r}")
        path.append(node)
        # follow the non-constant input
        nxt = [i for i in node.input if i in producers and i not in inits]
        if len(nxt) != 1:
            raise ExportError(f"cannot find the LM head behind {node.op_type} {node.name!r}")
        node = producers[nxt[0]]
    else:
        raise ExportError("cannot find the LM head: chain too long")
    w_name = node.input[1]
    if node.op_type == "MatMulNBits":      # the builder's quantized head: B [N, blocks, blob], rows = vocab
        if w_name not in inits:
            raise ExportError("LM head MatMulNBits weight is not an initializer")
        return node, inits[w_name], "NBITS", None, None, path
    bias = inits.get(node.input[2]) if node.op_type == "Gemm" and len(node.input) > 2 else None
    if node.op_type == "Gemm":
        attrs = {a.name: a for a in node.attribute}
        if "transA" in attrs and attrs["transA"].i:
            raise ExportError("LM head Gemm with transA is not supported")
        trans_b = bool(attrs["transB"].i) if "transB" in attrs else False
        if w_name not in inits:
            raise ExportError("LM head Gemm weight is not an initializer")
        return node, inits[w_name], "VH" if trans_b else "HV", None, bias, path
    if w_name in inits:
        return node, inits[w_name], "HV", None, None, path
    tp = producers.get(w_name)
    if tp is not None and tp.op_type == "Transpose" and tp.input[0] in inits:
        perm = [a.ints for a in tp.attribute if a.name == "perm"]
        if not perm or list(perm[0]) == [1, 0]:
            return node, inits[tp.input[0]], "VH", tp, None, path
    raise ExportError("cannot find the LM head weight: the logits MatMul's weight is neither an initializer "
                      "nor a transposed initializer")


def logits_dims_after_head_edit(graph, head, path):
    """After an edit of the LM head (pruned columns, sliced rows): drop the stale shapes of the head's
    output and of the ops between it and `logits`; returns the `logits` output's dims to fix."""
    stale = {head.output[0], *[o for n in path for o in n.output]}
    for vi in list(graph.value_info):
        if vi.name in stale:
            graph.value_info.remove(vi)
    return next(o for o in graph.output if o.name == "logits").type.tensor_type.shape.dim
