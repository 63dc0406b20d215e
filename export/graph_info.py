"""What an ONNX graph holds, read without its weights: every tensor, the IO names, and the parameter
count and bytes one decode forward reads. Shared by the exporters (onnx_export.py, builder.py), the
head pruner (prune.py) and the bundle writer."""
from __future__ import annotations

import numpy as np


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
