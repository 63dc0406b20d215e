"""Gemma-3 through onnxruntime-genai's model builder (export/builder.py): the builder rounds Gemma's
embedding scale sqrt(hidden_size) to 2 decimals; edgespec puts the exact value back, and the fp32 graph
then matches torch within the export check's tolerance. A tiny random Gemma-3 (hidden size 40:
sqrt = 6.3246, rounded 6.32) with Gemma-3's layer pattern (5 local layers, then a global one) and a
sliding window (8) shorter than the check input (12 + 4 tokens). The pinned builder ignores
`layer_types` (every 6th layer is global), so another pattern must not reach it."""
import json

import numpy as np
import pytest

from edgespec.export import builder as eb

pytest.importorskip("onnxruntime_genai")


@pytest.fixture(scope="module")
def tiny_gemma(tmp_path_factory):
    import torch
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    torch.manual_seed(0)
    cfg = Gemma3TextConfig(vocab_size=512, hidden_size=40, intermediate_size=64, num_hidden_layers=6,
                           num_attention_heads=2, num_key_value_heads=1, head_dim=16, sliding_window=8,
                           layer_types=["sliding_attention"] * 5 + ["full_attention"], max_position_embeddings=128,
                           query_pre_attn_scalar=16, rope_theta=1e6, rope_local_base_freq=1e4)
    model = Gemma3ForCausalLM(cfg).eval()
    with torch.no_grad():                      # big embeddings, as Gemma's are: the scale matters
        model.model.embed_tokens.weight.mul_(20.0)
    d = tmp_path_factory.mktemp("gemma") / "tiny-gemma3"
    model.save_pretrained(d)
    # the builder copies the tokenizer (AutoTokenizer): one as edgespec's GGUF converter writes it
    from tokenizers import Tokenizer, models

    Tokenizer(models.WordLevel({f"t{i}": i for i in range(512)}, unk_token="t0")).save(str(d / "tokenizer.json"))
    (d / "tokenizer_config.json").write_text('{"tokenizer_class": "PreTrainedTokenizerFast"}')
    return d


def _scale(onnx_path) -> float:
    import onnx
    from onnx import numpy_helper

    m = onnx.load(str(onnx_path), load_external_data=False)
    consts = {n.output[0]: n for n in m.graph.node if n.op_type == "Constant"}
    mul = next(n for n in m.graph.node if n.op_type == "Mul" and n.name.startswith("/model/embed_tokens"))
    return float(next(numpy_helper.to_array(consts[i].attribute[0].t) for i in mul.input if i in consts))


def test_gemma_graph_gets_the_exact_embedding_scale_and_passes_the_torch_check(tiny_gemma, tmp_path, monkeypatch):
    ce = eb.build_model(tiny_gemma, "tiny-gemma3", precision="fp32", cache=tmp_path / "fixed", progress=False)
    assert ce.meta["graph"]["fixes"] == [eb.GEMMA_EMBED_SCALE_FIX]
    assert _scale(ce.onnx) == float(np.float32(np.sqrt(40)))
    check = ce.meta["check"]
    assert check["ok"] and check["target_vs_torch_max_abs_diff"] < check["atol"], check

    # negative control: the builder's own graph, unfixed, has the rounded scale and is further from torch
    monkeypatch.setattr(eb, "graph_fixes", lambda hf_dir: ())
    raw = eb.build_model(tiny_gemma, "tiny-gemma3", precision="fp32", cache=tmp_path / "raw", progress=False)
    assert raw.dir.name != ce.dir.name and _scale(raw.onnx) == pytest.approx(6.32)
    assert raw.meta["check"]["target_vs_torch_max_abs_diff"] > 10 * check["target_vs_torch_max_abs_diff"]


def test_gemma3_with_another_layer_pattern_is_not_given_to_the_builder(tiny_gemma, tmp_path):
    assert eb.unsupported_reason(tiny_gemma) is None
    other = tmp_path / "other"
    other.mkdir()
    cfg = json.loads((tiny_gemma / "config.json").read_text())
    cfg["layer_types"] = ["sliding_attention", "full_attention"] * 3
    (other / "config.json").write_text(json.dumps(cfg))
    assert "every-6th-layer" in eb.unsupported_reason(other)


@pytest.mark.parametrize("gather", ["Gather", "GatherBlockQuantized"])
def test_embedding_scale_fix_finds_the_plain_and_the_int4_embedding_table(gather):
    """int4 builds gather Gemma's tied table with GatherBlockQuantized; the scale after it must be fixed too
    (before: 'no embedding-scale constant to correct' after a 6-minute build)."""
    from onnx import helper, numpy_helper

    scale = helper.make_node("Constant", [], ["s"], value=numpy_helper.from_array(np.array(25.3, np.float32), "v"))
    inputs = ["table", "input_ids"] + (["scales"] if gather != "Gather" else [])
    nodes = [scale, helper.make_node(gather, inputs, ["e"]), helper.make_node("Mul", ["e", "s"], ["h"])]
    model = helper.make_model(helper.make_graph(nodes, "g", [], []))
    assert eb._fix_embed_scale(model, 640) == pytest.approx(25.3)
    fixed = numpy_helper.to_array(model.graph.node[0].attribute[0].t)
    assert fixed == np.float32(np.sqrt(640)) and fixed != np.float32(25.3)
