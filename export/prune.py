"""LM-head pruning of an exported drafter by ONNX graph edit.

The node that produces `logits` is found structurally: walk back from the graph output through
elementwise ops (softcapping, casts, scalar scales) to the MatMul/Gemm whose weight is an
initializer, either directly (`MatMul(x, W[H,V])`, `Gemm(x, W, transB)`) or through a
`Transpose(E[V,H])` (the tied head optimum writes when accelerate is installed). The weight is
replaced by a new initializer holding only the kept columns, the `logits` dimension is fixed to K,
and two int64 constant outputs are added: `index_map[K]` (kept column -> target id, -1 if none) and
`draft_ids[K]` (kept column -> drafter id).

Memory: the graph is loaded without its external data; only the head weight is read (through a
memory map), and the other tensors are streamed one at a time into the new data file, so the
edit never holds a second copy of the model's weights.
"""
from __future__ import annotations

import mmap
from pathlib import Path

import numpy as np

from edgespec.errors import ExportError
from edgespec.export.graph_info import (all_tensors, find_head, io_names, logits_dims_after_head_edit, np_dtype,
                                        weight_stats)
from edgespec.export.last_logits import add_logits_to_keep

HEAD_NAME = "edgespec.lm_head.weight"
DATA_NAME = "model.onnx.data"
ALIGN = 4096


def _ext(tensor) -> dict:
    return {e.key: e.value for e in tensor.external_data}


def _is_external(tensor) -> bool:
    import onnx  # lazy: onnx is the [export] extra; `edgespec --help` imports this module

    return tensor.data_location == onnx.TensorProto.EXTERNAL


def read_tensor(tensor, base_dir: Path) -> np.ndarray:
    """A tensor's values; external data is memory-mapped (read-only), not loaded."""
    from onnx import numpy_helper  # lazy: onnx is the [export] extra

    if not _is_external(tensor):
        return numpy_helper.to_array(tensor)
    e = _ext(tensor)
    offset = int(e.get("offset", 0))
    dtype = np_dtype(tensor)
    shape = tuple(int(d) for d in tensor.dims)
    return np.memmap(base_dir / e["location"], dtype=dtype, mode="r", offset=offset, shape=shape)


def _consumers(graph, name: str) -> list:
    return [n for n in graph.node if name in n.input]


def prune_head(src: Path, dst_dir: Path, keep: np.ndarray, index_map: np.ndarray) -> dict:
    """Write `dst_dir/model.onnx` (+ `model.onnx.data` if the source used external data): the graph of
    `src` with its head restricted to the drafter ids `keep` and the constant outputs added.

    Returns {"layout", "hidden", "vocab", "kept", "external_data", "head_shared_with_embedding"}."""
    import onnx  # lazy: onnx is the [export] extra
    from onnx import TensorProto, helper, numpy_helper  # lazy: onnx is the [export] extra

    src = Path(src)
    dst_dir = Path(dst_dir)
    keep = np.asarray(keep, dtype=np.int64)
    index_map = np.asarray(index_map, dtype=np.int64)
    if keep.ndim != 1 or keep.size == 0 or keep.shape != index_map.shape:
        raise ExportError("kept ids and index map must be non-empty 1-D arrays of the same length")
    model = onnx.load(str(src), load_external_data=False)
    graph = model.graph
    mm, w_init, layout, tp, bias, path = find_head(graph)
    if layout == "NBITS":
        hidden, vocab, shared = _prune_nbits(graph, mm, keep, src.parent)
    else:
        hidden, vocab, shared = _prune_float(graph, mm, w_init, layout, tp, bias, keep, src.parent)
    k = int(keep.size)
    # Drop stale shapes on the head path and fix the logits output dimension.
    dims = logits_dims_after_head_edit(graph, mm, path)
    dims[len(dims) - 1].ClearField("dim_param")
    dims[len(dims) - 1].dim_value = k
    # Constant outputs.
    for name, arr in (("index_map", index_map), ("draft_ids", keep)):
        if any(o.name == name for o in graph.output):
            raise ExportError(f"drafter graph already has an output named {name!r}")
        graph.node.append(helper.make_node("Constant", [], [name], name=f"edgespec/{name}",
                                           value=numpy_helper.from_array(arr.astype(np.int64), name + "_value")))
        graph.output.append(helper.make_tensor_value_info(name, TensorProto.INT64, [k]))
    add_logits_to_keep(model)
    dst_dir.mkdir(parents=True, exist_ok=True)
    external = any(_is_external(t) for t in all_tensors(model))
    if external:
        _stream_external(model, src.parent, dst_dir)
    else:
        onnx.save_model(model, str(dst_dir / "model.onnx"))
    return {"layout": layout, "hidden": int(hidden), "vocab": int(vocab), "kept": k, "external_data": external,
            "head_shared_with_embedding": shared, "head_initializer": w_init.name,
            "weight_stats": weight_stats(model), "io": io_names(model)}


def _prune_float(graph, mm, w_init, layout, tp, bias, keep: np.ndarray, base: Path) -> tuple[int, int, bool]:
    """Replace a float head's weight by its kept columns; returns (hidden, vocab, weight still shared)."""
    from onnx import numpy_helper  # lazy: onnx is the [export] extra

    w = read_tensor(w_init, base)
    if w.ndim != 2:
        raise ExportError(f"LM head weight {w_init.name!r} is not 2-D: {w.shape}")
    vocab = w.shape[1] if layout == "HV" else w.shape[0]
    hidden = w.shape[0] if layout == "HV" else w.shape[1]
    if keep.min() < 0 or keep.max() >= vocab:
        raise ExportError(f"kept ids out of range for a head of {vocab} columns")
    # New head [H, K] as a fresh initializer (a tied embedding stays untouched for the Gather).
    new_w = np.ascontiguousarray(w[:, keep] if layout == "HV" else np.asarray(w[keep, :]).T)
    del w
    head = numpy_helper.from_array(new_w.astype(np_dtype(w_init), copy=False), HEAD_NAME)
    graph.initializer.append(head)
    if mm.op_type == "Gemm":
        # Re-express as Gemm(x, W'[H,K], bias[keep]) with transB=0.
        for a in list(mm.attribute):
            if a.name == "transB":
                mm.attribute.remove(a)
        mm.input[1] = HEAD_NAME
        if bias is not None:
            b = read_tensor(bias, base)
            nb = numpy_helper.from_array(np.ascontiguousarray(np.asarray(b)[keep]), HEAD_NAME + ".bias")
            graph.initializer.append(nb)
            mm.input[2] = nb.name
    else:
        mm.input[1] = HEAD_NAME
    shared = False
    if tp is not None and not _consumers(graph, tp.output[0]):
        graph.node.remove(tp)
    if not _consumers(graph, w_init.name):
        graph.initializer.remove(w_init)
    else:
        shared = True
    return int(hidden), int(vocab), shared


def _prune_nbits(graph, mm, keep: np.ndarray, base: Path) -> tuple[int, int, bool]:
    """Keep the rows `keep` of a MatMulNBits head (B [N, blocks, blob], scales, zero points, bias are
    all indexed by the output column n); each output column is computed on its own, so the kept
    logits are bitwise those of the full head."""
    from onnx import numpy_helper  # lazy: onnx is the [export] extra

    inits = {t.name: t for t in graph.initializer}
    attrs = {a.name: a for a in mm.attribute}
    n, hidden = int(attrs["N"].i), int(attrs["K"].i)
    if keep.min() < 0 or keep.max() >= n:
        raise ExportError(f"kept ids out of range for a head of {n} columns")
    if len(mm.input) > 4 and mm.input[4]:
        raise ExportError("LM head MatMulNBits with g_idx is not supported")
    shared = False
    for slot, suffix in ((1, ""), (2, ".scales"), (3, ".zero_points"), (5, ".bias")):
        if len(mm.input) <= slot or not mm.input[slot]:
            continue
        init = inits.get(mm.input[slot])
        if init is None:
            raise ExportError(f"LM head MatMulNBits input {slot} is not an initializer")
        arr = np.asarray(read_tensor(init, base))
        rows = arr.reshape(n, -1)[keep]           # [N, ...] or flat [N * blocks]: keep the layout
        rows = rows.reshape((keep.size,) + arr.shape[1:]) if arr.shape[0] == n else rows.reshape(-1)
        new = numpy_helper.from_array(np.ascontiguousarray(rows), HEAD_NAME + suffix)
        graph.initializer.append(new)
        mm.input[slot] = new.name
        if _consumers(graph, init.name):
            shared = True
        else:
            graph.initializer.remove(init)
    attrs["N"].i = int(keep.size)
    return hidden, n, shared


def _stream_external(model, src_dir: Path, dst_dir: Path) -> None:
    """Save `model` with every external tensor copied, one at a time, into dst_dir/model.onnx.data;
    large inline tensors (the new head) go there too."""
    import onnx  # lazy: onnx is the [export] extra

    data_path = dst_dir / DATA_NAME
    maps: dict[str, tuple] = {}
    with open(data_path, "wb") as out:
        def put(blob) -> tuple[int, int]:
            pos = out.tell()
            pad = (-pos) % ALIGN
            if pad:
                out.write(b"\0" * pad)
                pos += pad
            out.write(blob)
            return pos, len(blob)

        for t in all_tensors(model):
            if _is_external(t):
                e = _ext(t)
                loc = e["location"]
                if loc not in maps:
                    f = open(src_dir / loc, "rb")
                    maps[loc] = (f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ))
                mm = maps[loc][1]
                off, length = int(e.get("offset", 0)), int(e["length"])
                pos, n = put(mm[off:off + length])
            elif t.HasField("raw_data") and len(t.raw_data) >= 1024:
                pos, n = put(t.raw_data)
                t.ClearField("raw_data")
            else:
                continue
            del t.external_data[:]
            for key, value in (("location", DATA_NAME), ("offset", str(pos)), ("length", str(n))):
                entry = t.external_data.add()
                entry.key, entry.value = key, value
            t.data_location = onnx.TensorProto.EXTERNAL
    for f, mm in maps.values():
        mm.close()
        f.close()
    onnx.save_model(model, str(dst_dir / "model.onnx"))

