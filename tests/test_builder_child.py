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
    got = sliced_k_quant(original, rows=7)(data, 4, 32)
    assert len(got) == len(want) == 3
    assert got[0].dtype == np.uint8 and np.array_equal(got[0], want[0].astype("uint8"))   # the caller's cast
    assert np.array_equal(got[0], want[0])                                   # integers: exactly the same values
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

