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
    from onnx.external_data_helper import _get_all_tensors

    return _get_all_tensors(model)


def io_names(path_or_model) -> dict:
    import onnx

    m = path_or_model if isinstance(path_or_model, onnx.ModelProto) else \
        onnx.load(str(path_or_model), load_external_data=False)
    inits = {t.name for t in m.graph.initializer}
    return {"inputs": [i.name for i in m.graph.input if i.name not in inits],
            "outputs": [o.name for o in m.graph.output]}


def weight_stats(onnx_path_or_model) -> dict:
    """Parameter count and bytes one decode forward reads, from the graph's initializers.

    An initializer consumed only as the data input of Gather ops (an embedding table) counts one row;
    everything else counts in full (a pruned head is already K columns wide)."""
    import onnx

    model = onnx_path_or_model if isinstance(onnx_path_or_model, onnx.ModelProto) else \
        onnx.load(str(onnx_path_or_model), load_external_data=False)
    graph = model.graph
    uses: dict[str, list] = {}
    for n in graph.node:
        for idx, i in enumerate(n.input):
            uses.setdefault(i, []).append((n.op_type, idx))
    # An initializer read only through a Transpose that only Gathers consume (constant-folded by ORT
    # into an embedding table) also counts one row.
    gathered_transposes = {n.input[0] for n in graph.node if n.op_type == "Transpose" and uses.get(n.output[0])
                           and all(op == "Gather" and idx == 0 for op, idx in uses[n.output[0]])}
    params = 0
    bytes_fwd = 0
    for t in graph.initializer:
        numel = int(np.prod([int(d) for d in t.dims])) if len(t.dims) else 1
        if t.data_type in (onnx.TensorProto.INT4, onnx.TensorProto.UINT4):
            itemsize = 0.5
        else:
            try:
                itemsize = np_dtype(t).itemsize
            except (KeyError, TypeError, ValueError):
                itemsize = 1
        if t.data_type in (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16) or \
                t.data_type in (onnx.TensorProto.INT8, onnx.TensorProto.UINT8, onnx.TensorProto.INT4,
                                onnx.TensorProto.UINT4):
            params += numel if numel > 1 else 0
        u = uses.get(t.name, [])
        if u and len(t.dims) == 2 and all(op == "Gather" and idx == 0 for op, idx in u):
            bytes_fwd += int(int(t.dims[1]) * itemsize)
        elif len(t.dims) == 2 and t.name in gathered_transposes:   # the builder's tied table: Gather(W^T) + head
            others = [x for x in u if x[0] != "Transpose"]
            bytes_fwd += int(((numel if others else 0) + int(t.dims[0])) * itemsize)
        else:
            bytes_fwd += int(numel * itemsize)
    return {"params": int(params), "bytes_per_forward": int(bytes_fwd)}


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
