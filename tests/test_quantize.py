"""Quantized bundles (issue 7): int4/int8 export round-trips, bytes per forward, the quality check,
and the three bad inputs (already quantized, block size, EP without the kernels).

Tiny bundles: tiny-bl-a as target and pruned drafter, quantized through the export hook, from the
tiny fixtures' export cache. Real (`-m real`): the smollm-self pair, int4 and int8."""
import json
from pathlib import Path

import numpy as np
import onnx
import pytest

from distribution import ALPHA, check_lossless  # tests/ is on sys.path (conftest.py)
from edgespec.cli import main
from edgespec.errors import ExportError
from edgespec.export import quantize as q
from edgespec.export.graph_info import weight_stats
from edgespec.export.bundle_writer import export_bundle
from edgespec.export.quality import compare, held_out_ids
from edgespec.export.quantize_bundle import make_transform
from edgespec.runtime import Bundle, SpeculativeDecoder

PROMPTS = ["def quicksort(items):\n    ", "The quick brown fox"]
N = 24


def _export(models, cache, out: Path, scheme: str, **kw) -> Path:
    m = models["tiny-bl-a"]
    n = json.loads((m / "config.json").read_text())["vocab_size"]
    return export_bundle(str(m), str(m), out, keep=(3 * n) // 4, pair="tiny-q", progress=False, cache=cache,
                         transform=make_transform(scheme, scheme, quality_tokens=64, **kw))


@pytest.fixture(scope="module")
def qbundles(tiny_models, tiny_export_cache, tmp_path_factory):
    root = tmp_path_factory.mktemp("quantized")
    return {s: _export(tiny_models, tiny_export_cache, root / s, s) for s in ("int4", "int8")}


def _ops(path: Path) -> dict:
    m = onnx.load(str(path), load_external_data=False)
    out: dict = {}
    for n in m.graph.node:
        out[n.op_type] = out.get(n.op_type, 0) + 1
    return out


def _manifest(bundle: Path) -> dict:
    return json.loads((bundle / "manifest.json").read_text())


@pytest.mark.parametrize("scheme", ["int4", "int8"])
def test_quantized_bundle_loads_and_records_the_scheme(qbundles, scheme):
    man = _manifest(qbundles[scheme])
    for side in ("target", "drafter"):
        rec = man[side]["quantization"]
        assert rec["scheme"] == scheme and rec["bits"] == (4 if scheme == "int4" else 8)
        # the target keeps --block-size; the drafter takes the largest block its shapes allow (tiny: hidden 64)
        assert rec["block_size"] == (32 if side == "target" else 64) and rec["accuracy_level"] == 4
        assert man[side]["bytes_per_forward"] < rec["bytes_per_forward_fp32"] / (3 if scheme == "int4" else 1.8)
        ops = _ops(qbundles[scheme] / side / "model.onnx")
        assert "MatMul" in ops  # attention's activation x activation MatMuls stay float
        assert ops["MatMulNBits"] == 2 * 7 + 1  # 7 projections per layer + the LM head
    # the pruned drafter head is quantized: its MatMulNBits has N = K kept columns
    d = onnx.load(str(qbundles[scheme] / "drafter" / "model.onnx"), load_external_data=False)
    ns = [{a.name: a.i for a in n.attribute}["N"] for n in d.graph.node if n.op_type == "MatMulNBits"]
    assert man["drafter"]["kept"] in ns
    Bundle.load(qbundles[scheme], verify="full")


@pytest.mark.parametrize("scheme", ["int4", "int8"])
def test_quantized_greedy_identity_with_ar(qbundles, scheme):
    b = Bundle.load(qbundles[scheme])
    ar = SpeculativeDecoder(b, strategy="ar", threads=1)
    for k in (1, 4):
        dec = SpeculativeDecoder(b, strategy="tli", draft_length=k, threads=1)
        for p in PROMPTS:
            expect = ar.generate(p, max_new_tokens=N).token_ids
            assert len(expect) > 0
            assert dec.generate(p, max_new_tokens=N).token_ids == expect, (scheme, k, p)


def test_batch_invariance_is_checked_and_declared(qbundles):
    """accuracy_level 4: 1-token forwards compute other logits than wider ones; the export measures it and
    the graph asks for >= 2 tokens per forward, which ModelRunner honours."""
    from edgespec.runtime.engine.kv import ModelRunner
    from edgespec.runtime.engine.sessions import create_session

    for scheme in ("int4", "int8"):
        man = _manifest(qbundles[scheme])
        inv = man["target"]["quantization"]["batch_invariance"]
        assert inv["two_vs_wider_max_abs_diff"] <= inv["tolerance"]
        assert man["target"]["min_forward_tokens"] == inv["min_forward_tokens"] == \
            (1 if inv["one_vs_two_max_abs_diff"] <= inv["tolerance"] else 2)
        meta = onnx.load(str(qbundles[scheme] / "target" / "model.onnx"), load_external_data=False).metadata_props
        declared = {p.key: p.value for p in meta}.get("edgespec.min_forward_tokens", "1")
        assert int(declared) == inv["min_forward_tokens"]
        b = Bundle.load(qbundles[scheme])
        runner = ModelRunner(create_session(b.target.onnx, "cpu", threads=1)[0], "target")
        assert runner.min_tokens == inv["min_forward_tokens"]
        ids = b.target.tokenizer.encode("The quick brown fox jumps").ids
        wide = runner.forward(ids + [ids[-1]])[-2].copy()
        runner.reset()
        runner.forward(ids[:-1])
        step = runner.forward(ids[-1:])[-1].copy()
        assert runner.length == len(ids)
        assert np.abs(step - wide).max() <= inv["tolerance"]


def test_runner_padding_is_exact_on_a_float_graph(tiny_self_bundle):
    from edgespec.runtime.engine.kv import ModelRunner
    from edgespec.runtime.engine.sessions import create_session

    b = Bundle.load(tiny_self_bundle)
    plain = ModelRunner(create_session(b.target.onnx, "cpu", threads=1)[0], "target")
    padded = ModelRunner(create_session(b.target.onnx, "cpu", threads=1)[0], "target")
    padded.min_tokens = 3
    ids = [5, 17, 42, 7]
    a = [plain.forward(ids[:2]).copy()] + [plain.forward([t]).copy() for t in ids[2:]]
    c = [padded.forward(ids[:2]).copy()] + [padded.forward([t]).copy() for t in ids[2:]]
    assert padded.length == plain.length == 4 and [x.shape for x in c] == [x.shape for x in a]
    assert max(float(np.abs(x - y).max()) for x, y in zip(a, c)) < 1e-3


def test_quantized_bundle_is_lossless_at_temperature_1(qbundles):
    b = Bundle.load(qbundles["int4"])
    dec = SpeculativeDecoder(b, strategy="tli", draft_length=4, threads=1)
    pvals = check_lossless(dec, b, b.target.tokenizer.encode("The quick brown").ids, n=2000, seed=0)
    assert min(pvals.values()) > ALPHA, pvals


def _initializer_bytes_loaded(path: Path) -> int:
    """Independent count: load the tensors' bytes and sum them; a gathered table counts one row."""
    import shutil
    import tempfile

    data = Path(path).with_name("model.onnx.data")
    if data.is_file() and data.stat().st_nlink > 1:   # hard-linked from the export cache: onnx.load refuses it
        tmp = Path(tempfile.mkdtemp())
        shutil.copyfile(path, tmp / "model.onnx")
        shutil.copyfile(data, tmp / data.name)
        path = tmp / "model.onnx"
    m = onnx.load(str(path), load_external_data=True)
    gathered = {n.input[i] for n in m.graph.node for i in {"Gather": (0,), "GatherBlockQuantized": (0, 2, 3)}
                .get(n.op_type, ()) if i < len(n.input)}
    other = {i for n in m.graph.node for k, i in enumerate(n.input)
             if not (n.op_type == "Gather" and k == 0) and not (n.op_type == "GatherBlockQuantized" and k in (0, 2, 3))}
    total = 0
    for t in m.graph.initializer:
        nbytes = len(t.raw_data) if t.raw_data else onnx.numpy_helper.to_array(t).nbytes
        total += nbytes // t.dims[0] if t.name in gathered and t.name not in other else nbytes
    return total


@pytest.mark.parametrize("scheme", ["int4", "int8"])
def test_manifest_bytes_per_forward_is_the_sum_of_initializer_sizes(qbundles, scheme):
    man = _manifest(qbundles[scheme])
    for side in ("target", "drafter"):
        assert man[side]["bytes_per_forward"] == _initializer_bytes_loaded(qbundles[scheme] / side / "model.onnx")


def test_embedding_quantization_counts_one_row(tiny_export_cache, tmp_path):
    src = _cached_export(tiny_export_cache, "tiny-bl-a")
    dst = tmp_path / "e" / "model.onnx"
    rec = q.quantize_onnx(src, dst, "int4", embedding=True)
    assert rec["embedding_quantized"] and "GatherBlockQuantized" in rec["ops"]
    stats = weight_stats(dst)
    assert stats["bytes_per_forward"] == _initializer_bytes_loaded(dst) < stats["initializer_bytes"]


def test_weight_stats_counts_a_gathered_table_one_row_worked_example():
    """By hand: E [10, 3] only gathered reads 1 row (12 B); W [5, 3] is the head (60 B) and, through a
    Transpose only Gathers read, an embedding of W^T rows (5 floats, 20 B); B [3, 3] is read whole
    (36 B). Params: 30 + 15 + 9 = 54 (float tensors, logical)."""
    from onnx import TensorProto, helper, numpy_helper

    inits = [numpy_helper.from_array(np.zeros(shape, np.float32), name)
             for name, shape in (("E", (10, 3)), ("W", (5, 3)), ("B", (3, 3)))]
    nodes = [helper.make_node("Gather", ["E", "ids"], ["e"]), helper.make_node("Transpose", ["W"], ["WT"]),
             helper.make_node("Gather", ["WT", "ids"], ["w"]), helper.make_node("MatMul", ["e", "B"], ["h"]),
             helper.make_node("MatMul", ["h", "W"], ["logits"])]
    io = lambda name: helper.make_tensor_value_info(name, TensorProto.FLOAT, None)
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("ids", TensorProto.INT64, None)],
                              [io("logits"), io("w")], inits)
    assert weight_stats(helper.make_model(graph)) == {"params": 54, "bytes_per_forward": 12 + 60 + 20 + 36,
                                                      "initializer_bytes": 120 + 60 + 36}
    del graph.node[-1]                         # no head: W is read only as the transposed table
    assert weight_stats(helper.make_model(graph))["bytes_per_forward"] == 12 + 20 + 36


def test_quality_check_is_recorded_and_meaningful(qbundles, tiny_export_cache):
    for scheme in ("int4", "int8"):
        res = _manifest(qbundles[scheme])["checks"]["quantized_target_quality"]
        assert 0.0 <= res["top1_agreement"] <= 1.0 and 0.0 < res["mean_overlap"] <= 1.0
        assert res["positions"] == 64 and res["verdict"] in ("ok", "degraded")
        assert res["threshold"] == {"top1_agreement": 0.9, "mean_overlap": 0.9}
    # int8 is much closer to fp32 than int4 on the same weights
    q4 = _manifest(qbundles["int4"])["checks"]["quantized_target_quality"]
    q8 = _manifest(qbundles["int8"])["checks"]["quantized_target_quality"]
    assert q8["mean_overlap"] > q4["mean_overlap"]
    # a graph compared with itself agrees everywhere
    fp32 = _cached_export(tiny_export_cache, "tiny-bl-a")
    seqs = held_out_ids(qbundles["int4"] / "target" / "tokenizer.json", n_tokens=32, segment=16)
    same = compare(fp32, fp32, seqs)
    assert same["top1_agreement"] == 1.0 and same["mean_overlap"] == pytest.approx(1.0, abs=1e-5)


def _cached_export(cache: Path, name: str) -> Path:
    for meta in cache.glob("*/edgespec-export.json"):
        m = json.loads(meta.read_text())
        if m["name"] == name and (m.get("graph") or {}).get("precision", "fp32") == "fp32":   # the float graph
            return meta.parent / "model.onnx"
    raise AssertionError(f"no cached export of {name} in {cache}")


def _close_to_float(src: Path, dst: Path, vocab: int, min_corr: float) -> None:
    from edgespec.export.onnx_export import check_inputs, ort_session, run_prefill_decode

    x = check_inputs(vocab)
    ref = run_prefill_decode(ort_session(src), x)
    got = run_prefill_decode(ort_session(dst), x)
    assert got.shape == ref.shape and np.isfinite(got).all()
    assert np.corrcoef(got.ravel(), ref.ravel())[0, 1] > min_corr


def test_external_data_in_external_data_out(tiny_models, tiny_export_cache, tmp_path):
    """A source with external data (the 1.5B) gives a quantized graph with external data beside it."""
    src = tmp_path / "src" / "model.onnx"
    src.parent.mkdir()
    onnx.save_model(onnx.load(str(_cached_export(tiny_export_cache, "tiny-bl-a"))), str(src), save_as_external_data=True,
                    all_tensors_to_one_file=True, location="model.onnx.data", size_threshold=0)
    dst = tmp_path / "q" / "model.onnx"
    rec = q.quantize_onnx(src, dst, "int4")
    assert rec["external_data"] and (dst.parent / "model.onnx.data").is_file()
    assert weight_stats(dst)["bytes_per_forward"] == _initializer_bytes_loaded(dst)
    vocab = json.loads((tiny_models["tiny-bl-a"] / "config.json").read_text())["vocab_size"]
    _close_to_float(src, dst, vocab, 0.9)


def test_int8_dynamic(tiny_models, tiny_export_cache, tmp_path):
    src = _cached_export(tiny_export_cache, "tiny-bl-a")
    dst = tmp_path / "d" / "model.onnx"
    rec = q.quantize_onnx(src, dst, "int8-dynamic")
    assert rec["block_size"] is None and rec["ops"] == ["DynamicQuantizeLinear", "MatMulInteger"]
    assert _ops(dst)["MatMulInteger"] == _ops(src)["MatMul"]     # every weight MatMul, the head included
    vocab = json.loads((tiny_models["tiny-bl-a"] / "config.json").read_text())["vocab_size"]
    _close_to_float(src, dst, vocab, 0.95)


def test_tied_transposed_head_gets_its_own_quantized_weight(tmp_path):
    """optimum writes a tied head as MatMul(x, Transpose(E)) when accelerate is present: the head gets
    a quantized E^T of its own, the embedding Gather keeps E."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    v, h = 96, 64
    emb = numpy_helper.from_array(rng.standard_normal((v, h)).astype(np.float32), "E")
    w = numpy_helper.from_array(rng.standard_normal((h, h)).astype(np.float32) / 8, "W")
    nodes = [helper.make_node("Gather", ["E", "input_ids"], ["x"]),
             helper.make_node("MatMul", ["x", "W"], ["y"]),
             helper.make_node("Transpose", ["E"], ["Et"], perm=[1, 0]),
             helper.make_node("MatMul", ["y", "Et"], ["logits"])]
    graph = helper.make_graph(nodes, "tied", [helper.make_tensor_value_info("input_ids", TensorProto.INT64, [1, "s"])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, "s", v])], [emb, w])
    src = tmp_path / "tied.onnx"
    onnx.save_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10), str(src))
    dst = tmp_path / "q" / "model.onnx"
    rec = q.quantize_onnx(src, dst, "int4")
    assert rec["tied_heads_materialized"] == 1
    ops = _ops(dst)
    assert ops == {"Gather": 1, "MatMulNBits": 2}
    import onnxruntime as ort

    ids = rng.integers(0, v, (1, 8), dtype=np.int64)
    ref = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"]).run(None, {"input_ids": ids})[0]
    got = ort.InferenceSession(str(dst), providers=["CPUExecutionProvider"]).run(None, {"input_ids": ids})[0]
    assert np.corrcoef(got.ravel(), ref.ravel())[0, 1] > 0.98


# ----------------------------------------------------------------------------- bad input

def test_refuses_an_already_quantized_model(qbundles, tmp_path):
    with pytest.raises(ExportError, match="already quantized.*MatMulNBits"):
        q.quantize_onnx(qbundles["int4"] / "target" / "model.onnx", tmp_path / "x" / "model.onnx", "int8")
    assert not (tmp_path / "x" / "model.onnx").exists()


def test_refuses_a_block_size_the_dimensions_do_not_divide(tiny_models, tiny_export_cache, tmp_path):
    with pytest.raises(ExportError, match=r"block size 128 does not divide 64, the K \(input dim\).*\[16, 32, 64\]"):
        _export(tiny_models, tiny_export_cache, tmp_path / "b", "int4", block_size=128)
    assert not (tmp_path / "b").exists()


@pytest.mark.parametrize("scheme,ep,embedding,match", [
    ("int4", "tensorrt", False, "MatMulNBits kernel, which the tensorrt EP .*lacks.*CPU, CUDA, Dml"),
    ("int8-dynamic", "cuda", False, "DynamicQuantizeLinear/MatMulInteger kernel, which the cuda EP"),
    ("int4", "dml", True, "GatherBlockQuantized kernel, which the dml EP.*drop --quantize-embedding"),
])
def test_refuses_a_scheme_the_ep_lacks(scheme, ep, embedding, match):
    with pytest.raises(ExportError, match=match):
        make_transform(scheme, None, ep=ep, embedding=embedding)


def test_refuses_int8_dynamic_for_the_target():
    with pytest.raises(ExportError, match="int8-dynamic .* drafter only"):
        make_transform("int8-dynamic", "int4")
    assert make_transform("int4", "int8-dynamic").sides == {"target": "int4", "drafter": "int8-dynamic"}
    assert make_transform("none", "int8").sides == {"drafter": "int8"} and make_transform("none", None) is None


def test_cli_refusal_is_one_line_and_exit_2(capsys, tmp_path):
    rc = main(["export", "--target", "x", "--drafter", "x", "--keep", "8", "--out", str(tmp_path / "o"),
               "--quantize", "int4", "--quantize-ep", "tensorrt"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and err.startswith("edgespec: error:") and "MatMulNBits" in err and "\n" not in err
    assert not (tmp_path / "o").exists()


# ----------------------------------------------------------------------------- real model (CI)

@pytest.fixture(scope="module")
def smollm_quantized(tmp_path_factory):
    out = {}
    for scheme in ("int4", "int8"):
        path = tmp_path_factory.mktemp("smollm-q") / f"smollm-self-{scheme}"
        rc = main(["export", "--pair", "smollm-self", "--keep", "8192", "--out", str(path), "--quiet",
                   "--quantize", scheme, "--block-size", "32"])
        assert rc == 0
        out[scheme] = path
    return out


@pytest.mark.real
@pytest.mark.parametrize("scheme", ["int4", "int8"])
def test_smollm_quantized_bundle(smollm_quantized, scheme):
    path = smollm_quantized[scheme]
    man = _manifest(path)
    assert man["target"]["quantization"]["scheme"] == scheme
    assert man["target"]["bytes_per_forward"] == _initializer_bytes_loaded(path / "target" / "model.onnx")
    quality = man["checks"]["quantized_target_quality"]
    assert quality["positions"] == 512
    if scheme == "int8":
        assert quality["verdict"] == "ok", quality
    b = Bundle.load(path)
    ar = SpeculativeDecoder(b, strategy="ar", threads=1)
    dec = SpeculativeDecoder(b, strategy="tli", draft_length=4, threads=1)
    for p in ["def fibonacci(n):", "The capital of France is"]:
        expect = ar.generate(p, max_new_tokens=24)
        assert expect.text.strip()
        assert dec.generate(p, max_new_tokens=24).token_ids == expect.token_ids
    # top_k keeps the exact oracle cheap (it branches over every x1 it can sample)
    pvals = check_lossless(dec, b, b.target.tokenizer.encode("The quick brown").ids, n=600, seed=0,
                           temperature=1.0, top_k=20)
    assert min(pvals.values()) > ALPHA, pvals


def test_verify_cost_reports_ratios_against_the_first_k(tiny_self_bundle, tmp_path):
    """`python -m edgespec.profiler.verify_cost`: medians per k and ratios to the first k, in JSON."""
    from edgespec.profiler import verify_cost

    out = tmp_path / "cost.json"
    assert verify_cost.main([str(tiny_self_bundle), "--k", "1,4", "--past", "8", "--repeats", "2",
                             "--json", str(out)]) == 0
    (res,) = json.loads(out.read_text()).values()
    assert res["ratio_wall"]["1"] == 1.0 and res["ratio_wall"]["4"] == res["wall_ms"]["4"] / res["wall_ms"]["1"]
    assert all(v > 0 for v in res["wall_ms"].values())
