"""Every recipe's architecture exports (models/*.toml `arch`: llama for SmolLM2, qwen2 for Qwen2.5-Coder,
gemma3 for Gemma-3-270M) and decodes losslessly. The real weights are too big for CI, so each runs as a
tiny random twin with its model's attention layout (tests/tinymodels.py `tiny_config`): qwen2's biased
QKV, gemma3's q/k norms (the builder then feeds GroupQueryAttention query, key and value apart) and its
sliding-window layers (window 8, shorter than the texts here). Exported through the default path
(onnxruntime-genai's model builder, fp32) as a self pair, with the padded-attention graph
(export/padded_attention.py), whose rewrite crashed the gemma3-270m export when it padded the query
alone. A variant the export cannot build or check is left out with one line, never a traceback."""
from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import numpy as np
import onnx
import pytest

import tinymodels  # tests/ is on sys.path (conftest.py)
from edgespec.export import padded_attention as pa
from edgespec.export.bundle_writer import export_bundle
from edgespec.export.onnx_export import ort_session
from edgespec.models import model_recipes
from edgespec.runtime import SpeculativeDecoder
from edgespec.runtime.engine.kv import ModelRunner

pytest.importorskip("onnxruntime_genai")

PROMPT = "def add(a, b):\n    return a + b\n\nclass Stack:\n    def push(self, item):"
KIND = {"llama": "bytelevel", "qwen2": "bytelevel", "gemma3": "spiece"}
LAYERS = {"llama": 2, "qwen2": 2, "gemma3": 6}          # gemma3: 5 sliding-window layers, then a global one


def test_every_recipe_architecture_has_a_tiny_twin():
    assert {r.arch for r in model_recipes().values()} <= set(tinymodels.ARCHS) == set(KIND)


@pytest.fixture(scope="module")
def toks():
    return tinymodels.tiny_tokenizers()


@pytest.fixture(scope="module", params=tinymodels.ARCHS)
def exported(request, toks, tmp_path_factory) -> tuple[str, Path, str]:
    """(arch, bundle, the export's progress lines): the twin exported as a self pair, keep 3/4."""
    arch = request.param
    work = tmp_path_factory.mktemp(f"arch-{arch}")
    hf = tinymodels.build_tiny_model(work / "hf", toks[KIND[arch]], KIND[arch], seed=5, tie=arch == "gemma3",
                                     layers=LAYERS[arch], arch=arch)
    n = json.loads((hf / "config.json").read_text())["vocab_size"]
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        out = export_bundle(str(hf), str(hf), work / "bundle", keep=(3 * n) // 4, pair=f"tiny-{arch}",
                            progress=True, cache=work / "cache")
    return arch, out, err.getvalue()


def test_it_exports_builder_graphs_with_a_padded_attention_graph(exported):
    arch, bundle, err = exported
    man = json.loads((bundle / "manifest.json").read_text())
    assert man["target"]["graph"]["kind"] == "builder", err
    assert f"target/{pa.PADDED_GRAPH}" in man["files"] and "no padded_attention.onnx" not in err
    assert np.isfinite(man["checks"]["padded_attention_vs_padded_steps_max_abs_diff"])
    nodes = onnx.load(str(bundle / "target" / pa.PADDED_GRAPH), load_external_data=False).graph.node
    gqa = [n for n in nodes if n.op_type == "GroupQueryAttention"]
    apart = all(n.input[1] and n.input[2] for n in gqa)       # query, key and value fed apart
    assert apart == (arch == "gemma3")
    concats = sum(n.op_type == "Concat" and n.name.endswith(("_qkv", "_key", "_value")) for n in nodes)
    assert len(gqa) == LAYERS[arch] and concats == len(gqa) * (3 if apart else 1)


def test_its_padded_graph_computes_what_model_onnx_does_at_every_width_of_two_or_more(exported):
    """The padding row is after every real one: the real rows (past the sliding window too) equal
    model.onnx's exactly where both run 2+ queries."""
    _, bundle, _ = exported
    ids = np.random.default_rng(0).integers(10, 300, 40).astype(np.int64)
    for width in (2, 3):
        logits = []
        for graph in ("model.onnx", pa.PADDED_GRAPH):
            runner = ModelRunner(ort_session(bundle / "target" / graph), "check")
            runner.forward(ids[:16])
            logits.append(np.concatenate([runner.forward(ids[i:i + width]).copy() for i in range(16, 40, width)]))
        np.testing.assert_array_equal(logits[1], logits[0])


@pytest.mark.parametrize("step_graph", ["export's plan", "padded graph"])
def test_greedy_speculation_on_it_equals_ar(exported, copy_bundle, step_graph):
    arch, bundle, _ = exported
    if step_graph == "padded graph":        # the plan of a machine whose padded steps are exact
        bundle = copy_bundle(bundle)
        man = json.loads((bundle / "manifest.json").read_text())
        man["checks"]["padded_attention_vs_padded_steps_max_abs_diff"] = 0.0
        (bundle / "manifest.json").write_text(json.dumps(man))
    dec = SpeculativeDecoder(bundle, strategy="tli", draft_length=3, threads=1)
    assert (dec.target.pad_rows == 1) == (step_graph == "padded graph")
    want = dec.variant("ar").generate(PROMPT, max_new_tokens=24).token_ids
    assert len(want) == 24 or arch != "llama"
    for strategy in ("tli", "sd", "ngram"):
        got = (dec if strategy == "tli" else dec.variant(strategy)).generate(PROMPT, max_new_tokens=24).token_ids
        assert got == want, (arch, step_graph, strategy)


@pytest.mark.parametrize("exported", ["gemma3"], indirect=True)
def test_a_padded_graph_the_check_cannot_run_is_left_out_in_one_line(exported, copy_bundle, monkeypatch):
    """The rewrite of before (the query padded alone) on gemma3's separate query, key and value: ORT
    refuses it in the check; the graph is removed with one line naming why, never a traceback."""
    _, bundle, _ = exported
    target = copy_bundle(bundle) / "target"
    (target / pa.PADDED_GRAPH).unlink()

    pad = pa.pad_attention

    def query_only(model):             # pad_attention, then key and value put back unpadded
        kv = [tuple(n.input[1:3]) for n in model.graph.node if n.op_type == "GroupQueryAttention"]
        edited = pad(model)
        for node, (k, v) in zip([n for n in model.graph.node if n.op_type == "GroupQueryAttention"], kv):
            node.input[1], node.input[2] = k, v
        return edited

    monkeypatch.setattr(pa, "pad_attention", query_only)
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        assert pa.write_and_check(target, progress=True) is None
    lines = err.getvalue().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"edgespec: no {pa.PADDED_GRAPH} in this bundle"), lines
    assert "could not build or check it" in lines[0] and "GroupQueryAttention" in lines[0]
    assert not (target / pa.PADDED_GRAPH).exists()
    with contextlib.redirect_stderr(io.StringIO()) as quiet:
        assert pa.write_and_check(target, progress=False) is None
    assert quiet.getvalue() == ""

