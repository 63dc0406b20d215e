"""export/builder_child.py: the model builder with its memory peak cut must write the builder's own bytes."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from edgespec.export.builder_child import sliced_k_quant


def _original_k_quant():
    from onnxruntime.quantization.neural_compressor.weight_only import quant_tensor_k_quant_cpu

    return quant_tensor_k_quant_cpu


def test_sliced_k_quant_returns_the_same_arrays():
    """Slices of 7 blocks (the last one shorter), a transposed (non-contiguous) weight as the builder passes
    it, constant blocks (min == max) and outliers: every output equals the one-call result bitwise."""
    original = _original_k_quant()
    rng = np.random.default_rng(0)
    weight = rng.standard_normal((96, 50)).astype(np.float32) * 0.05       # in x out, as ORT stores a MatMul B
    weight[:32, 3] = 0.25                                                   # one constant block
    weight[5, 7] = 40.0                                                     # an outlier
    data = weight.T                                                         # (out, in): non-contiguous view
    want = original(data, 4, 32)
    for workers in (1, 3):                                                  # in order, in threads
        got = sliced_k_quant(original, rows=7, workers=workers)(data, 4, 32)
        assert len(got) == len(want) == 3
        assert got[0].dtype == np.uint8 and np.array_equal(got[0], want[0].astype("uint8"))   # the caller's cast
        assert np.array_equal(got[0], want[0])                               # integers: exactly the same values
        for g, w in zip(got[1:], want[1:]):
            assert g.dtype == w.dtype and g.shape == w.shape and np.array_equal(g, w)
    small = sliced_k_quant(original, rows=10_000)(data, 4, 32)             # one slice: the original call
    assert all(np.array_equal(s, w) for s, w in zip(small, want))


@pytest.mark.parametrize("precision", ["int4"])
def test_builder_child_writes_the_builders_bytes(tiny_models, tmp_path, precision):
    """The same builder command through onnxruntime_genai.models.builder and through builder_child: the
    graph and its external data are byte-identical (the IR tensors released early, k-quant sliced).
    The plain builder runs with torch on one thread (OMP_NUM_THREADS=1), as the child sets itself: with
    two, about one build in eight computes cos_cache's second half differently (builder_child.py, 3.)."""
    hf = tiny_models["tiny-bl-a"]
    base_env = dict(os.environ, TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    base_env.pop("OMP_NUM_THREADS", None)
    outs = {}
    for name, module in (("plain", "onnxruntime_genai.models.builder"), ("child", "edgespec.export.builder_child")):
        env = dict(base_env, OMP_NUM_THREADS="1") if name == "plain" else base_env
        out = tmp_path / name
        cmd = [sys.executable, "-m", module, "-i", str(hf), "-o", str(out), "-p", precision, "-e", "cpu",
               "-c", str(tmp_path / f"{name}-cache"), "--extra_options", "accuracy_level=4", "block_size=32",
               "algo_config=k_quant"]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
        assert proc.returncode == 0, proc.stdout[-1500:] + proc.stderr[-1500:]
        outs[name] = out
    for f in ("model.onnx", "model.onnx.data"):
        plain, child = (outs["plain"] / f).read_bytes(), (outs["child"] / f).read_bytes()
        assert len(plain) > 0 and plain == child, f



def test_plain_reader_reads_what_safe_open_reads(tmp_path):
    """export/safetensors_reader.py against safetensors' own reader: keys, metadata, dtypes, shapes, values."""
    import torch
    from safetensors import safe_open
    from safetensors.torch import save_file

    from edgespec.export.safetensors_reader import PlainReader

    g = torch.Generator().manual_seed(0)
    tensors = {"w.f32": torch.randn(7, 5, generator=g), "w.bf16": torch.randn(3, 4, generator=g).to(torch.bfloat16),
               "b.i64": torch.arange(6, dtype=torch.int64).reshape(2, 3), "s.f16": torch.tensor(1.5, dtype=torch.float16),
               "e.f32": torch.zeros(0, 4)}
    path = tmp_path / "m.safetensors"
    save_file(tensors, str(path), metadata={"format": "pt"})
    with safe_open(str(path), framework="pt") as want, PlainReader(str(path), framework="pt") as got:
        assert got.keys() == sorted(want.keys()) and got.metadata() == want.metadata()
        for k in want.keys():
            a, b = want.get_slice(k), got.get_slice(k)
            assert a.get_dtype() == b.get_dtype() and list(a.get_shape()) == b.get_shape()
            x, y = want.get_tensor(k), b[...]
            assert x.dtype == y.dtype and torch.equal(x, y), k
        assert torch.equal(got.get_slice("w.f32")[1:3], want.get_slice("w.f32")[1:3])
