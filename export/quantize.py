"""Weight quantization of exported graphs with ONNX Runtime's own quantizers (no quantizer of ours).

Schemes (`quantize_onnx(src, dst, scheme=...)`):
  int4          `MatMulNBitsQuantizer`, 4-bit block-wise weights (MatMulNBits) for every MatMul with a
                constant weight, the LM head included (a pruned drafter head too), and on request
                (`embedding=True`) the embedding Gather (GatherBlockQuantized, block-wise along the
                hidden axis; it shrinks the file but not the bytes per forward, which read one row).
  int8          the same quantizer with bits=8: weight-only block-wise 8-bit MatMulNBits (the
                embedding stays float: ORT's quantizer does 4-bit Gathers only).
  int8-dynamic  `quantize_dynamic`: int8 weights (per output channel) and activations quantized on
                the fly (DynamicQuantizeLinear + MatMulInteger, fused by ORT on CPU). Weights use
                reduce_range (7 bits): on AVX2 CPUs without VNNI (this 2-core EPYC) ORT's u8s8 kernel
                saturates its int16 sums, and full-range weights dropped the tiny model's logit
                correlation with fp32 to 0.928 (0.95+ with reduce_range).

`accuracy_level` is MatMulNBits' compute type on CPU: 0/None unset (fp32), 1 fp32, 2 fp16, 3 bf16,
4 int8 activations. 4 is what makes a k-token verify cheap on x86 (see docs/quantization.md); the
default for the CPU EP is therefore 4.

Refusals (ExportError, one line): a model that is already quantized, a block size that a quantized
dimension does not divide (naming the dimension), and a scheme whose kernels the chosen EP lacks
(from ORT 1.31's kernel registry: onnxruntime's docs/OperatorKernels.md, in the onnxruntime repository,
not this one; onnxruntime-gpu's own registry query segfaults on machines without CUDA, so it is a
table here).

Memory: the source graph is loaded whole (ORT's quantizer works on an in-memory ModelProto), so the
peak is about twice the fp32 weights (1.4 GB for SmolLM2, ~14 GB for Qwen2.5-1.5B). Graphs over
~1.8 GB, or whose source used external data, are written with external data `<name>.data`.
"""
from __future__ import annotations

import logging
import shutil
import tempfile
from pathlib import Path

import numpy as np

from edgespec.errors import ExportError

SCHEMES = ("int4", "int8", "int8-dynamic")
BLOCK_SIZES = (16, 32, 64, 128, 256)
DEFAULT_BLOCK_SIZE = 32
# A drafter's int4 blocks, largest first: its numerics never change the output (the target verifies), so
# it takes the largest its shapes allow: fewer scale bytes per step (docs/quantization.md).
DRAFTER_BLOCK_SIZES = (128, 64, DEFAULT_BLOCK_SIZE)
ACCURACY_LEVELS = (0, 1, 2, 3, 4)
CPU_ACCURACY_LEVEL = 4
EXTERNAL_THRESHOLD = 1800 * 1024**2   # protobuf's hard limit is 2 GiB; keep a margin
TRANSPOSED_SUFFIX = ".edgespec_T"

# Ops whose presence means a graph is already quantized.
QUANT_OPS = {"MatMulNBits", "GatherBlockQuantized", "DynamicQuantizeLinear", "MatMulInteger",
             "DynamicQuantizeMatMul", "MatMulIntegerToFloat", "QuantizeLinear", "DequantizeLinear",
             "MatMulFpQ4", "MatMulBnb4", "QGemm", "QAttention", "QLinearMatMul", "QLinearConv",
             "QLinearAdd", "QLinearMul", "QOrderedMatMul"}

# The quantized-graph kernels each EP registers in ORT 1.31 (onnxruntime's docs/OperatorKernels.md). CUDA's
# MatMulInteger takes int8 activations only and it has no DynamicQuantizeLinear, so int8-dynamic
# graphs do not run there. Compiling EPs (TensorRT, QNN, OpenVINO, CoreML, ...) register no kernels
# for these com.microsoft ops: the nodes would silently fall back to CPU.
EP_KERNELS = {
    "CPUExecutionProvider": {"MatMulNBits", "GatherBlockQuantized", "DynamicQuantizeLinear", "MatMulInteger",
                             "DynamicQuantizeMatMul", "MatMulIntegerToFloat"},
    "CUDAExecutionProvider": {"MatMulNBits", "GatherBlockQuantized"},
    "DmlExecutionProvider": {"MatMulNBits", "DynamicQuantizeMatMul", "MatMulIntegerToFloat", "MatMulInteger"},
}
EP_NAMES = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider", "tensorrt": "TensorrtExecutionProvider",
            "dml": "DmlExecutionProvider", "qnn": "QNNExecutionProvider", "openvino": "OpenVINOExecutionProvider",
            "coreml": "CoreMLExecutionProvider", "rocm": "ROCMExecutionProvider"}


# ----------------------------------------------------------------------------- validation

def required_ops(scheme: str, embedding: bool = True) -> list[str]:
    """The contrib/quantized ops a graph quantized with `scheme` needs its EP to implement."""
    if scheme == "int4":
        return ["MatMulNBits"] + (["GatherBlockQuantized"] if embedding else [])
    if scheme == "int8":
        return ["MatMulNBits"]
    if scheme == "int8-dynamic":
        return ["DynamicQuantizeLinear", "MatMulInteger"]
    raise ExportError(f"unknown quantization scheme {scheme!r}; use one of {', '.join(SCHEMES)}")


def ep_provider(ep: str) -> str:
    return EP_NAMES.get(ep.lower(), ep)


def check_ep(scheme: str, ep: str = "cpu", embedding: bool = True) -> None:
    """Refuse a scheme whose kernels `ep` lacks in ORT 1.31, naming the missing op."""
    provider = ep_provider(ep)
    have = EP_KERNELS.get(provider, set())
    missing = [op for op in required_ops(scheme, embedding) if op not in have]
    if not missing:
        return
    where = sorted(p.replace("ExecutionProvider", "") for p, ops in EP_KERNELS.items() if missing[0] in ops)
    hint = " (or keep the embedding float: drop --quantize-embedding)" if missing == ["GatherBlockQuantized"] else ""
    raise ExportError(f"--quantize {scheme} needs the {'/'.join(missing)} kernel, which the {ep} EP ({provider}) "
                      f"lacks in ONNX Runtime 1.31; it exists on: {', '.join(where) or 'no EP'}{hint}")


def check_accuracy_level(scheme: str, level: int | None) -> None:
    if level is None:
        return
    if level not in ACCURACY_LEVELS:
        raise ExportError(f"--accuracy-level must be one of {ACCURACY_LEVELS} (MatMulNBits compute type), got {level}")
    if scheme == "int8-dynamic" and level:
        raise ExportError("--accuracy-level applies to MatMulNBits (int4/int8), not to int8-dynamic")


def already_quantized(model) -> list[str]:
    """Reasons `model` (a ModelProto) is already quantized; empty if it is a float graph."""
    import onnx  # lazy: onnx and ORT's quantizers load on use; `edgespec --help` imports this module

    ops = sorted({n.op_type for n in model.graph.node if n.op_type in QUANT_OPS})
    reasons = [f"{op} nodes" for op in ops]
    low = {onnx.TensorProto.INT8, onnx.TensorProto.UINT8, onnx.TensorProto.INT4, onnx.TensorProto.UINT4}
    qinits = [t.name for t in model.graph.initializer
              if t.data_type in low and len(t.dims) >= 2 and int(np.prod(t.dims)) >= 256]
    if qinits:
        reasons.append(f"{len(qinits)} int8/int4 weight initializers (e.g. {qinits[0]!r})")
    return reasons


def quantizable_weights(model, embedding: bool) -> list[tuple[str, str, int, str]]:
    """(node name, weight name, blocked dim size, which dim) for every weight the quantizer would block."""
    inits = {t.name: t for t in model.graph.initializer}
    out = []
    for n in model.graph.node:
        if n.op_type == "MatMul" and n.input[1] in inits and len(inits[n.input[1]].dims) == 2:
            w = inits[n.input[1]]
            out.append((n.name, w.name, int(w.dims[0]), f"K (input dim) of weight {list(w.dims)}"))
        elif embedding and n.op_type == "Gather" and n.input[0] in inits and len(inits[n.input[0]].dims) == 2:
            w = inits[n.input[0]]
            out.append((n.name, w.name, int(w.dims[1]), f"hidden dim of embedding {list(w.dims)}"))
    return out


def dividing_block_sizes(dims, sizes=BLOCK_SIZES) -> list[int]:
    """The block sizes among `sizes` (in their order) that divide every one of `dims`."""
    return [b for b in sizes if all(d % b == 0 for d in dims)]


def largest_block_size(model, embedding: bool = True, sizes=DRAFTER_BLOCK_SIZES) -> int:
    """The first of `sizes` dividing every quantized dimension (a drafter's default: larger blocks,
    fewer scale bytes per step); check_block_size reports it if none does."""
    dims = [d for _, _, d, _ in quantizable_weights(model, embedding)]
    return next(iter(dividing_block_sizes(dims, sizes)), sizes[-1])


def check_block_size(model, block_size: int, embedding: bool = True) -> None:
    if block_size not in BLOCK_SIZES:
        raise ExportError(f"--block-size must be one of {BLOCK_SIZES} (a power of two >= 16), got {block_size}")
    weights = quantizable_weights(model, embedding)
    if not weights:
        raise ExportError("nothing to quantize: the graph has no MatMul with a constant 2-D weight")
    for node, _, dim, what in weights:
        if dim % block_size:
            ok = dividing_block_sizes([d for _, _, d, _ in weights])
            raise ExportError(f"block size {block_size} does not divide {dim}, the {what} of node {node!r}; "
                              f"block sizes that divide every quantized dimension: {ok or 'none'}")


# ----------------------------------------------------------------------------- graph preparation

def materialize_transposed_heads(model) -> int:
    """A tied head is `MatMul(x, Transpose(E))`; ORT's quantizer only takes a constant MatMul weight,
    so give such MatMuls a new initializer E^T (the embedding Gather keeps E). Returns the count."""
    from onnx import numpy_helper  # lazy: onnx is the [export] extra

    inits = {t.name: t for t in model.graph.initializer}
    producers = {o: n for n in model.graph.node for o in n.output}
    count = 0
    for n in model.graph.node:
        if n.op_type != "MatMul" or n.input[1] in inits:
            continue
        tp = producers.get(n.input[1])
        if tp is None or tp.op_type != "Transpose" or tp.input[0] not in inits:
            continue
        perm = [list(a.ints) for a in tp.attribute if a.name == "perm"]
        src = inits[tp.input[0]]
        if len(src.dims) != 2 or (perm and perm[0] != [1, 0]):
            continue
        name = src.name + TRANSPOSED_SUFFIX
        if name not in inits:
            arr = np.ascontiguousarray(numpy_helper.to_array(src).T)
            inits[name] = numpy_helper.from_array(arr, name)
            model.graph.initializer.append(inits[name])
        n.input[1] = name
        count += 1
    used = {i for node in model.graph.node for i in node.input}
    for node in [nd for nd in model.graph.node if nd.op_type == "Transpose" and not any(o in used for o in nd.output)]:
        if node.input[0] in inits:
            model.graph.node.remove(node)
    return count


# ----------------------------------------------------------------------------- quantization

def quantize_onnx(src_model_path, dst_model_path, scheme: str = "int4",
                  block_size: int | str = DEFAULT_BLOCK_SIZE,
                  accuracy_level: int | None = None, ep: str = "cpu", embedding: bool = False,
                  symmetric: bool = False) -> dict:
    """Quantize the float graph at `src_model_path` into `dst_model_path` (+ `<name>.data` when large).

    `block_size` "largest": largest_block_size's. Returns the record the manifest keeps under `quantization`."""
    import onnx  # lazy: onnx is the [export] extra

    src, dst = Path(src_model_path), Path(dst_model_path)
    if scheme not in SCHEMES:
        raise ExportError(f"unknown quantization scheme {scheme!r}; use one of {', '.join(SCHEMES)}")
    embedding = embedding and scheme == "int4"
    check_accuracy_level(scheme, accuracy_level)
    check_ep(scheme, ep, embedding)
    if accuracy_level is None and scheme != "int8-dynamic" and ep_provider(ep) == "CPUExecutionProvider":
        accuracy_level = CPU_ACCURACY_LEVEL
    try:
        model = onnx.load(str(src), load_external_data=False)  # the graph first: refusals cost no weight reads
    except Exception as exc:
        raise ExportError(f"cannot read ONNX model {src}: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}") from exc
    reasons = already_quantized(model)
    if reasons:
        raise ExportError(f"{src} is already quantized ({'; '.join(reasons)}); quantize the float export instead")
    external_src = any(t.data_location == onnx.TensorProto.EXTERNAL for t in model.graph.initializer)
    if external_src:
        from onnx.external_data_helper import load_external_data_for_model  # lazy: onnx is the [export] extra

        load_external_data_for_model(model, str(src.parent))
    tied = materialize_transposed_heads(model)
    if scheme != "int8-dynamic" and block_size == "largest":
        block_size = largest_block_size(model, embedding)
    if scheme != "int8-dynamic":
        check_block_size(model, block_size, embedding)
    else:
        block_size = None
        if not quantizable_weights(model, False):
            raise ExportError("nothing to quantize: the graph has no MatMul with a constant 2-D weight")
    dst.parent.mkdir(parents=True, exist_ok=True)
    quiet = logging.getLogger("onnxruntime.quantization")
    old, quiet.level = quiet.level, logging.ERROR
    root_old = logging.getLogger().level
    logging.getLogger().setLevel(logging.ERROR)
    try:
        with np.errstate(divide="ignore", invalid="ignore"):  # all-zero blocks (e.g. a zero pad-token row)
            if scheme == "int8-dynamic":
                model = _quantize_dynamic(model, dst)
            else:
                model = _quantize_nbits(model, 4 if scheme == "int4" else 8, block_size, accuracy_level, embedding,
                                        symmetric)
    finally:
        quiet.level = old
        logging.getLogger().setLevel(root_old)
    ops = sorted({n.op_type for n in model.graph.node if n.op_type in QUANT_OPS})
    external = _save(model, dst, force_external=external_src)
    del model
    return {"scheme": scheme, "method": _method(scheme), "bits": 4 if scheme == "int4" else 8,
            "block_size": block_size, "accuracy_level": accuracy_level if scheme != "int8-dynamic" else None,
            "symmetric": bool(symmetric) if scheme != "int8-dynamic" else True,
            "embedding_quantized": bool(embedding), "tied_heads_materialized": tied,
            "ops": ops, "ep": ep, "external_data": external, **_versions()}


def _method(scheme: str) -> str:
    return {"int4": "onnxruntime.quantization.MatMulNBitsQuantizer (RTN, bits=4)",
            "int8": "onnxruntime.quantization.MatMulNBitsQuantizer (RTN, bits=8)",
            "int8-dynamic": "onnxruntime.quantization.quantize_dynamic (QInt8, per-channel)"}[scheme]


def _versions() -> dict:
    import onnxruntime  # lazy: ORT loads on use

    return {"onnxruntime": onnxruntime.__version__}


def _quantize_nbits(model, bits: int, block_size: int, accuracy_level: int | None, embedding: bool, symmetric: bool):
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer  # lazy: ORT loads on use

    ops = ("MatMul", "Gather") if embedding else ("MatMul",)
    q = MatMulNBitsQuantizer(model, bits=bits, block_size=block_size, is_symmetric=symmetric,
                             accuracy_level=accuracy_level or None, op_types_to_quantize=ops,
                             quant_axes=(("MatMul", 0), ("Gather", 1)))
    q.process()
    return q.model.model


def _quantize_dynamic(model, dst: Path):
    """quantize_dynamic writes a file; run it into a scratch dir next to dst and load the result."""
    import onnx  # lazy: onnx is the [export] extra
    from onnxruntime.quantization import QuantType, quantize_dynamic  # lazy: ORT loads on use

    tmp = Path(tempfile.mkdtemp(prefix=".qdyn-", dir=dst.parent))
    try:
        out = tmp / "model.onnx"
        quantize_dynamic(model, out, op_types_to_quantize=["MatMul"], per_channel=True, reduce_range=True,
                         weight_type=QuantType.QInt8,
                         use_external_data_format=model.ByteSize() > EXTERNAL_THRESHOLD // 4,
                         extra_options={"MatMulConstBOnly": True})
        return onnx.load(str(out), load_external_data=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _save(model, dst: Path, force_external: bool = False) -> bool:
    """Write `dst` (+ `dst.name + '.data'` when large or when the source had external data)."""
    import onnx  # lazy: onnx is the [export] extra

    data = dst.with_name(dst.name + ".data")
    data.unlink(missing_ok=True)
    size = sum(len(t.raw_data) for t in model.graph.initializer)
    external = force_external or size > EXTERNAL_THRESHOLD
    if external:
        onnx.save_model(model, str(dst), save_as_external_data=True, all_tensors_to_one_file=True,
                        location=data.name, size_threshold=1024)
    else:
        onnx.save_model(model, str(dst))
    return external
