"""The model builder's child process, with its memory peak cut and its output bytes unchanged.

`python -m edgespec.export.builder_child ARGS` runs `python -m onnxruntime_genai.models.builder ARGS`
(export/builder.py starts it) after three patches that only change *when* memory is used and freed, and with torch on one thread (3.):

0. The HF checkpoint is read tensor by tensor with plain reads, not memory-mapped
   (export/safetensors_reader.py): the shard pages no longer sit in the RSS during the load
   (Qwen2.5-Coder-1.5B: every one of its 340 state-dict tensors bitwise equal to safe_open's).

1. Quantized precisions (int4/int8): the builder holds the model's float weights as torch tensors in
   its ONNX IR graph, then copies the whole graph into one ModelProto (`ir.to_proto`) for ORT's
   MatMulNBitsQuantizer: both copies of the float weights (2 x 7.1 GB for Qwen2.5-Coder-1.5B) live
   at once. Here each IR tensor is released as soon as it is serialised into the proto, so the float
   weights exist about once.
2. k_quant (the int4 default): ORT's CPU k-quant (`quant_tensor_k_quant_cpu`) works on a whole weight
   at once with some ten float32 temporaries of its size; on a 151,936 x 1,536 LM head that is about
   9 GB for one call. Every operation in it is per quantization block (one row of the reshaped weight,
   reductions along that row only), so it is run on slices of K_QUANT_ROWS rows and the results are
   concatenated: the same values, a bounded temporary, and (the temporaries fitting in the CPU's
   cache) 1.65x faster: 1.70 s instead of 2.82 s on a 1,536 x 2,048 weight here. The quantized
   values (integers 0..2^bits-1, which the original returns as float64 and its caller casts to
   uint8) come back as uint8 already, an eighth of the size. The slices run on the cores in threads
   (NumPy releases the GIL in its array operations) and are concatenated in order.
3. torch runs on one intra-op thread. The builder's RoPE caches are `emb.cos()` / `emb.sin()` in
   torch, and with two threads about one build in eight (tiny model, 16 builds) computed the second
   half of cos_cache on a less accurate path (errors up to 1.5e-4 against float64, instead of 3.5e-8):
   the same command wrote different bytes. With one thread, 16 of 16 builds were identical and
   accurate. The builder's torch work is loading and transposes, so nothing measurable is lost.

tests/test_builder_child.py checks that the sliced k-quant returns bitwise the same arrays and that a
builder graph made through this module has the same bytes as one made by the builder alone.
"""
from __future__ import annotations

import importlib
import os
import runpy
import sys
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import numpy as np

K_QUANT_ROWS = 4096             # blocks per slice: 4,096 x 32 floats = 512 KiB per temporary (stays in cache)
K_QUANT_WORKERS = 8


def sliced_k_quant(original, rows: int = K_QUANT_ROWS, workers: int | None = None):
    """`original(data, num_bits, group_size)` applied to slices of `rows` quantization blocks, `workers`
    slices at a time (threads: NumPy releases the GIL inside its array operations; default: the cores,
    at most K_QUANT_WORKERS). The slices are independent and concatenated in order: the same values."""
    workers = workers or max(1, min(os.cpu_count() or 1, K_QUANT_WORKERS))

    def k_quant(data, num_bits=4, group_size=32):
        def one(blocks):
            q, scale, zero_point = original(blocks, num_bits, group_size)
            return q.astype(np.uint8), scale, zero_point

        blocks = np.reshape(data, (-1, group_size))
        slices = [blocks[i:i + rows] for i in range(0, blocks.shape[0], rows)]
        if workers == 1 or len(slices) == 1:
            parts = [one(b) for b in slices]
        else:
            with ThreadPoolExecutor(min(workers, len(slices))) as pool:
                parts = list(pool.map(one, slices))
        return tuple(np.concatenate(column, axis=0) for column in zip(*parts))

    return k_quant


def _release(tensor) -> None:
    """Drop what an IR tensor holds (a torch tensor, or a lazy tensor's thunk and its cached value)."""
    for attr in ("_raw", "_tensor", "_func"):
        if hasattr(tensor, attr):
            setattr(tensor, attr, None)


def _patch_k_quant() -> None:
    # ORT's quantization package imports onnx; only this child process, about to run the builder, needs it.
    from onnxruntime.quantization.neural_compressor import weight_only  # lazy: [export] extra, child only

    weight_only.quant_tensor_k_quant_cpu = sliced_k_quant(weight_only.quant_tensor_k_quant_cpu)


def _patch_to_nbits() -> None:
    """Model.to_nbits serialises the IR graph once (`ir.to_proto`); during that call, each initializer's
    tensor is released once the last initializer that holds it has been serialised."""
    # onnxruntime_genai.models puts its folder on sys.path (the builder imports `builders`): before builders.base.
    import onnxruntime_genai.models  # noqa: F401  # lazy: [export] extra; must precede builders.base
    from onnx_ir import serde  # lazy: [export] extra, patched in the builder's child process only

    base = importlib.import_module("builders.base")     # the module object builder.py itself uses

    original_to_nbits = base.Model.to_nbits
    original_serialize = serde.serialize_tensor_into

    def to_nbits(self):
        users = Counter(id(v.const_value) for v in self.model.graph.initializers.values() if v.const_value is not None)

        def serialize_tensor_into(tensor_proto, from_):
            original_serialize(tensor_proto, from_)
            key = id(from_)
            if key in users:
                users[key] -= 1
                if users[key] == 0:
                    _release(from_)

        serde.serialize_tensor_into = serialize_tensor_into
        try:
            return original_to_nbits(self)
        finally:
            serde.serialize_tensor_into = original_serialize

    base.Model.to_nbits = to_nbits


def _patch_safetensors_loading() -> None:
    """transformers reads the checkpoint with plain reads, not a memory map (export/safetensors_reader.py)."""
    from transformers import modeling_utils  # lazy: [export] extra, child process only

    from edgespec.export.safetensors_reader import PlainReader  # lazy: child process only

    modeling_utils.safe_open = PlainReader


def main(argv: list[str]) -> None:
    import torch  # lazy: [export] extra, child process only

    torch.set_num_threads(1)          # deterministic, accurate RoPE caches (3. above)
    _patch_safetensors_loading()
    _patch_k_quant()
    _patch_to_nbits()
    sys.argv = ["onnxruntime_genai.models.builder", *argv]
    runpy.run_module("onnxruntime_genai.models.builder", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv[1:])
