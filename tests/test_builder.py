"""Builder graphs (onnxruntime-genai's model builder, export/builder.py): what export makes by default,
the one-line fallback to optimum, and failures that leave nothing behind."""
import json
import shutil

import numpy as np
import pytest

from edgespec.cli import main
from edgespec.errors import ExportError
from edgespec.export import builder as eb
from edgespec.export.bundle_writer import export_bundle
from edgespec.runtime import Bundle, SpeculativeDecoder


def _graph(path, side):
    return json.loads((path / "manifest.json").read_text())[side]["graph"]


@pytest.mark.parametrize("side", ["target", "drafter"])
def test_default_export_is_fused_with_a_shared_kv_cache(tiny_same_bundle, side):
    import onnx

    g = _graph(tiny_same_bundle, side)
    m = onnx.load(str(tiny_same_bundle / side / "model.onnx"), load_external_data=False)
    ops = [n.op_type for n in m.graph.node]
    assert g["kind"] == "builder" and g["kv_cache"] == "shared" and g["ep"] == "cpu"
    assert ops.count("GroupQueryAttention") == g["group_query_attention"] == 2   # one per layer
    # the manifest counts the built graph; the bundle adds logits_to_keep's 5 nodes (Neg, two Slices after
    # the last attention and two Constants: export/last_logits.py) to both, the greedy ids' 4 (ArgMax, Cast,
    # a Constant, ReduceSum: export/greedy_ids.py) to the target, and pruning the two constant outputs to
    # the drafter
    assert len(ops) == g["nodes"] + 5 + (2 if side == "drafter" else 4) < 1000
    assert "logits_to_keep" in {i.name for i in m.graph.input} and ops.count("Slice") >= 2
    meta = {p.key: p.value for p in m.metadata_props}
    assert meta["edgespec.kv_cache"] == "shared" and meta["edgespec.graph"] == "builder/fp32"
    if side == "drafter":      # the pruned head's constant outputs survive on the builder graph
        assert {"index_map", "draft_ids"} <= {o.name for o in m.graph.output}


def test_unsupported_architecture_falls_back_to_optimum_in_one_line(tiny_models, tiny_export_cache, tmp_path,
                                                                    monkeypatch, capsys):
    monkeypatch.setattr(eb, "ARCHITECTURES", frozenset())
    out = tmp_path / "b"
    export_bundle(str(tiny_models["tiny-bl-a"]), str(tiny_models["tiny-bl-b"]), out, keep=100,
                  cache=tiny_export_cache, progress=True)
    err = [ln for ln in capsys.readouterr().err.splitlines() if "graphs:" in ln]
    assert err == ["edgespec: graphs: optimum (the model builder does not take architecture LlamaForCausalLM)"]
    assert _graph(out, "target") == {"kind": "optimum", "kv_cache": "copy"}
    # an optimum bundle (today's format) still runs, on the copying cache
    dec = SpeculativeDecoder(Bundle.load(out), strategy="tli", draft_length=3, threads=1)
    assert not dec.target.shared
    assert dec.generate("def f(x):", max_new_tokens=8).token_ids == \
        dec.variant("ar").generate("def f(x):", max_new_tokens=8).token_ids


def test_graph_builder_refuses_an_unsupported_architecture(tiny_models, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(eb, "ARCHITECTURES", frozenset())
    rc = main(["export", "--target", str(tiny_models["tiny-bl-a"]), "--drafter", str(tiny_models["tiny-bl-b"]),
               "--keep", "100", "--graph", "builder", "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and err.startswith("edgespec: error: --graph builder: the model builder does not take") \
        and "\n" not in err
    assert not (tmp_path / "o").exists()


def test_builder_failure_leaves_no_half_written_bundle(tiny_models, tmp_path, monkeypatch):
    """A real builder run that fails (weights missing): one-line ExportError, no bundle, no temp dirs."""
    broken = tmp_path / "hf-broken"
    shutil.copytree(tiny_models["tiny-bl-a"], broken)
    (broken / "model.safetensors").unlink()
    monkeypatch.setattr(eb, "_torch_logits", lambda hf_dir, ids, name: (np.zeros((1, 16, 8), np.float32), 0))
    cache, out = tmp_path / "cache", tmp_path / "out" / "bundle"
    with pytest.raises(ExportError, match=r"the model builder failed on hf-broken \(fp32, cpu; exit \d+\)") as e:
        export_bundle(str(broken), str(broken), out, keep=100, cache=cache, progress=False)
    assert "\n" not in str(e.value)
    assert not out.exists() and (not out.parent.exists() or not list(out.parent.iterdir()))
    assert not [p for p in cache.rglob("*") if ".tmp-" in p.name or p.name.endswith(".builder.log")]


def test_builder_settings_from_flags():
    import argparse

    from edgespec.export import quantize_bundle as qb

    ns = argparse.Namespace(quantize="int4", quantize_target=None, quantize_drafter="fp16", quantize_ep="cpu",
                            accuracy_level=None, block_size=32, quality_tokens=0, drafter_block_size=None)
    s = qb.builder_settings(ns)
    assert s["target"] == "int4" and s["drafter"] == "fp16" and "unsupported" not in s
    assert s["block_size"] == 32 and s["drafter_block_size"] is None
    ns.drafter_block_size = 64
    assert qb.builder_settings(ns)["drafter_block_size"] == 64
    ns.quantize = "int8-dynamic"
    assert "not a model-builder precision" in qb.builder_settings(ns)["unsupported"]


def test_fp16_graph_for_a_gpu_ep(tiny_models, tmp_path, capsys):
    """`--quantize fp16 --quantize-ep cuda`: the builder's fp16 CUDA graph, recorded as such."""
    out = tmp_path / "fp16"
    rc = main(["export", "--target", str(tiny_models["tiny-bl-a"]), "--drafter", str(tiny_models["tiny-bl-b"]),
               "--keep", "100", "--quantize", "fp16", "--quantize-ep", "cuda", "--out", str(out)])
    assert rc == 0, capsys.readouterr().err
    m = json.loads((out / "manifest.json").read_text())
    for side in ("target", "drafter"):
        assert m[side]["graph"]["precision"] == "fp16" and m[side]["graph"]["ep"] == "cuda"
        assert m[side]["dtype"] == "fp16"
    # the fp16 CUDA graph runs on this CPU EP too, so the pruned head is checked by running it
    assert m["checks"]["pruned_vs_full_max_abs_diff"] == 0.0 and m["checks"]["constant_outputs_ok"]
    assert "pruned drafter not run" not in capsys.readouterr().err
    rc = main(["export", "--target", str(tiny_models["tiny-bl-a"]), "--drafter", str(tiny_models["tiny-bl-b"]),
               "--keep", "100", "--quantize", "fp16", "--graph", "optimum", "--out", str(tmp_path / "o")])
    assert rc == 2 and "fp16 graphs come from the model builder only" in capsys.readouterr().err


def test_disk_check_counts_builder_graphs_at_their_precision(tiny_models, tmp_path):
    """An int4 builder export needs its graphs' share of the fp32 weights, the quality check's fp32
    reference where it will be built, and nothing for a graph already cached (the demo was refused with
    12 GB free when every graph was counted at fp32)."""
    from edgespec.export import bundle_writer as BW
    from edgespec.export.pair_graphs import GRAPH_SHARE, builder_disk_need
    from edgespec.export.sources import resolve

    t, d = resolve(str(tiny_models["tiny-bl-a"]), False), resolve(str(tiny_models["tiny-bl-b"]), False)
    w_t, w_d = BW._param_estimate(t.hf_dir), BW._param_estimate(d.hf_dir)
    opts = {"target": "int4", "drafter": "int4"}
    need, t_bytes, d_bytes = builder_disk_need(t, d, opts, tmp_path, BW._param_estimate)
    q = GRAPH_SHARE["int4"]
    assert (t_bytes, d_bytes) == (int(w_t * q), int(w_d * q))
    assert need == int(w_t * q) + int(w_d * q) + w_t                  # + the fp32 reference
    assert need < 2 * (w_t + w_d)
    no_check, _, _ = builder_disk_need(t, d, {**opts, "quality_tokens": 0}, tmp_path, BW._param_estimate)
    assert no_check == int(w_t * q) + int(w_d * q)
    cached = eb.build_path(t.hf_dir, t.sha256, "int4", cache=tmp_path)[0]   # the target graph already built
    cached.mkdir(parents=True)
    (cached / "model.onnx").write_bytes(b"graph")
    (cached / "edgespec-export.json").write_text("{}")
    assert eb.is_built(cached)
    assert builder_disk_need(t, d, {**opts, "quality_tokens": 0}, tmp_path, BW._param_estimate)[0] == int(w_d * q)


def _config_dir(tmp_path, name, hidden, heads, head_dim, intermediate):
    d = tmp_path / name
    d.mkdir()
    (d / "config.json").write_text(json.dumps({
        "model_type": "qwen2", "hidden_size": hidden, "num_attention_heads": heads, "head_dim": head_dim,
        "intermediate_size": intermediate, "num_hidden_layers": 2, "vocab_size": 1000}))
    return d


@pytest.mark.parametrize("shape, algo, expected", [
    ((896, 14, 64, 4864), None, (128, "rtn")),           # Qwen2.5-0.5B: 896 / 128 = 7 blocks, odd for k_quant
    ((896, 14, 64, 4864), "k_quant", (64, "k_quant")),   # asked for k_quant: the largest block it takes
    ((896, 14, 64, 4864), "rtn", (128, "rtn")),
    ((1536, 12, 128, 8960), None, (128, "k_quant")),      # Qwen2.5-1.5B: 12 and 70 blocks
    ((576, 9, 64, 1536), None, (64, "rtn")),              # SmolLM2-135M: 128 does not divide 576
    ((100, 4, 25, 300), None, (32, "k_quant")),           # nothing divides: the smallest, the default method
])
def test_drafter_quantization_takes_the_largest_block_its_shapes_allow(tmp_path, shape, algo, expected):
    assert eb.drafter_quantization(_config_dir(tmp_path, "m", *shape), algo) == expected


def test_drafter_options_follow_the_flag_and_leave_float_graphs_alone(tmp_path):
    from edgespec.export.pair_graphs import drafter_options
    from edgespec.models.weights import ModelSource

    src = ModelSource(spec="x", kind="local", name="x", hf_dir=_config_dir(tmp_path, "m", 896, 14, 64, 4864),
                      sha256="0" * 64)
    assert drafter_options(src, "int4", {}) == {"block_size": 128, "algo": "rtn"}
    assert drafter_options(src, "int4", {"drafter_block_size": 64}) == {"block_size": 64, "algo": "k_quant"}
    assert drafter_options(src, "int4", {"drafter_block_size": 32, "algo": "rtn"}) == {"block_size": 32, "algo": "rtn"}
    assert drafter_options(src, "fp32", {"drafter_block_size": 64}) == {}


def test_a_target_that_is_not_batch_invariant_is_refused_a_drafter_is_not(capsys):
    from edgespec.export.quality import require_exact_target

    with pytest.raises(ExportError, match="speculative decoding would not be exact"):
        require_exact_target({"min_forward_tokens": None, "two_vs_wider_max_abs_diff": 0.75}, progress=False)
    require_exact_target({"min_forward_tokens": 2, "one_vs_two_max_abs_diff": 0.5}, progress=True)
    assert ">= 2 tokens per forward" in capsys.readouterr().err
    require_exact_target({"min_forward_tokens": 1}, progress=True)
    require_exact_target(None, progress=True)              # a float graph: nothing measured
    assert capsys.readouterr().err == ""


def test_a_drafter_block_size_outside_the_choices_is_one_line(capsys):
    from edgespec.export.quantize_bundle import make_transform

    with pytest.raises(ExportError, match=r"--drafter-block-size must be one of \(16, 32, 64, 128, 256\), got 100"):
        make_transform("int4", "int4", drafter_block_size=100)
    assert make_transform("int4", "int4", drafter_block_size=128).sides == {"target": "int4", "drafter": "int4"}
    with pytest.raises(SystemExit) as exit_info:       # argparse's choices: usage and one error line
        main(["export", "--target", "x", "--quantize", "int4", "--drafter-block-size", "100", "--out", "y"])
    assert exit_info.value.code == 2 and "argument --drafter-block-size: invalid choice: 100" in capsys.readouterr().err
