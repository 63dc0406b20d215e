"""The GPU execution provider's soundness, checked without a GPU (benchmarks/gpu_check.py runs the same
code on one): the KV-layout decision fed with node placements, ORT's placement read on the CPU EP, the
device probes of runtime/engine/probes.py on runners whose kernels are made to misbehave, and `export --ep cuda`."""
import json
import warnings

import numpy as np
import pytest

from edgespec.cli import main
from edgespec.runtime import Bundle, SpeculativeDecoder
from edgespec.runtime.engine.kv import KV_KEY, ModelRunner
from edgespec.runtime.engine.kv_shared import SharedLayout
from edgespec.runtime.engine.placement import CPU, RECORD_KEY, PlacedNode, kv_placement, read_placement
from edgespec.runtime.engine.probes import check_device_session, one_token_steps_exact, shared_layout_diff
from edgespec.runtime.engine.sessions import create_session

CUDA = "CUDAExecutionProvider"


def _graph(attention_ep: str, layers: int = 2) -> list[PlacedNode]:
    nodes = [PlacedNode("/model/attn_mask_reformat/Gather", "Gather", CPU)]
    for i in range(layers):
        nodes += [PlacedNode(f"/model/layers.{i}/attn/qkv_proj/MatMul", "MatMul", CUDA),
                  PlacedNode(f"/model/layers.{i}/attn/GroupQueryAttention", "GroupQueryAttention", attention_ep)]
    return nodes


def test_kv_placement_decision():
    ok = kv_placement(_graph(CUDA), CUDA)
    assert ok.ep == CUDA and ok.reason is None
    fp32 = kv_placement(_graph(CPU), CUDA, "target")        # ORT has no fp32 GQA kernel on CUDA
    assert fp32.ep == CPU and "export --ep cuda" in fp32.reason and fp32.reason.startswith("target: ")
    assert "\n" not in fp32.reason
    split = _graph(CUDA) + [PlacedNode("/model/layers.9/attn/GroupQueryAttention", "GroupQueryAttention", CPU)]
    assert kv_placement(split, CUDA).ep is None
    assert kv_placement([PlacedNode("m", "MatMul", CUDA)], CUDA).ep is None      # nothing writes the cache in place
    assert kv_placement(None, CUDA).ep == CUDA          # unknown: the numeric probe decides


def test_read_placement_on_the_cpu_ep(tiny_self_bundle):
    import onnxruntime as ort

    path = Bundle.load(tiny_self_bundle).target.runtime_onnx
    so = ort.SessionOptions()
    so.add_session_config_entry(RECORD_KEY, "1")
    nodes = read_placement(ort.InferenceSession(str(path), so, providers=[CPU]))
    if nodes is None:
        pytest.skip(f"onnxruntime {ort.__version__} has no get_provider_graph_assignment_info")
    gqa = [n for n in nodes if n.op_type == "GroupQueryAttention"]
    assert len(gqa) == 2 and {n.ep for n in nodes} == {CPU}
    assert kv_placement(nodes, CPU) == kv_placement(nodes, CPU).__class__(CPU)
    assert read_placement(ort.InferenceSession(str(path), providers=[CPU])) is None     # not recorded


class _CacheWrittenElsewhere(SharedLayout):
    """The shared layout as it broke on CUDA: what attention writes never reaches the bound buffers."""

    def run(self, session, input_ids, rows, pad_rows, ids=False):
        past = self.length
        out = super().run(session, input_ids, rows, pad_rows, ids)
        for h in self.host:
            h[:, :, past:] = 0.5
        return out


class _OneRowPath(SharedLayout):
    """A kernel whose one-row path computes other bits (CUDA's GEMV for 1-token steps)."""

    def run(self, session, input_ids, rows, pad_rows, ids=False):
        out = super().run(session, input_ids, rows, pad_rows, ids)
        return out + np.float32(1e-3) if input_ids.shape[1] == 1 else out


def _with_layout(layout):
    return type(f"RunnerWith{layout.__name__}", (ModelRunner,), {"shared_layout": layout})


def _runner(cls, bundle_path):
    b = Bundle.load(bundle_path)
    return b, cls(create_session(b.target.runtime_onnx, "cpu", threads=1, role="target")[0], "target",
                  b.target.max_position)


def test_shared_layout_probe_keeps_a_sound_layout_and_drops_a_broken_one(tiny_self_bundle):
    b, sound = _runner(ModelRunner, tiny_self_bundle)
    assert sound.shared and shared_layout_diff(sound) <= 1e-6
    assert sound.length == 0 and sound.forwards == 0
    _, broken = _runner(_with_layout(_CacheWrittenElsewhere), tiny_self_bundle)
    assert shared_layout_diff(broken) > 0.05
    with pytest.warns(RuntimeWarning, match="shared KV layout gave other logits .* copied between steps"):
        check_device_session(broken, CPU, exact=False)     # placement unknown here: the probe decides
    assert not broken.shared
    ids = b.target.tokenizer.encode("def quicksort(items):").ids
    ref = np.stack([sound.forward(ids).copy()[-1], sound.forward([ids[0]]).copy()[-1]])
    got = np.stack([broken.forward(ids)[-1].copy(), broken.forward([ids[0]])[-1].copy()])
    assert np.allclose(ref, got, atol=1e-5)


def test_one_token_probe_pads_where_one_row_differs(tiny_self_bundle):
    _, plain = _runner(ModelRunner, tiny_self_bundle)
    exact = one_token_steps_exact(plain)         # MLAS's fp32 one-row path: a property of this CPU
    with warnings.catch_warnings():
        warnings.simplefilter("error")           # 2- and 4-token forwards agree: nothing to say
        width = check_device_session(plain, CPU, exact=True)
    assert width == (1 if exact else 2)
    _, odd = _runner(_with_layout(_OneRowPath), tiny_self_bundle)
    assert not one_token_steps_exact(odd)
    assert check_device_session(odd, CPU, exact=True) == 2 and odd.length == 0
    _, drafter = _runner(_with_layout(_OneRowPath), tiny_self_bundle)
    assert check_device_session(drafter, CPU, exact=False) == 1      # a drafter's steps need not be exact


@pytest.mark.parametrize("quantize,precision", [("none", "fp16"), ("int4", "int4")])
def test_export_for_cuda(tiny_models, tmp_path, quantize, precision):
    """`export --ep cuda`: the model builder's CUDA graphs (fp16, or int4 with fp16 activations),
    attention in GroupQueryAttention over a shared past/present buffer, the EP recorded; they load on
    this CPU EP, where every strategy's greedy output equals ar's."""
    import onnx

    m = str(tiny_models["tiny-bl-a"])
    out = tmp_path / precision
    assert main(["export", "--target", m, "--drafter", m, "--keep", "400", "--ep", "cuda", "--quantize", quantize,
                 "--quiet", "--out", str(out)]) == 0
    man = json.loads((out / "manifest.json").read_text())
    for side in ("target", "drafter"):
        g = man[side]["graph"]
        assert (g["ep"], g["precision"], g["kv_cache"], g["group_query_attention"]) == ("cuda", precision, "shared", 2)
        model = onnx.load(str(out / side / "model.onnx"), load_external_data=False)
        meta = {p.key: p.value for p in model.metadata_props}
        assert meta[KV_KEY] == "shared"
        types = {v.name: v.type.tensor_type.elem_type for v in [*model.graph.input, *model.graph.output]}
        assert types["past_key_values.0.key"] == types["present.0.key"] == onnx.TensorProto.FLOAT16
        assert types["logits"] == onnx.TensorProto.FLOAT16
        if precision == "int4":
            levels = {a.i for n in model.graph.node if n.op_type == "MatMulNBits" for a in n.attribute
                      if a.name == "accuracy_level"}
            assert levels <= {0}            # fp16 activations: no int8 path
    assert man["checks"]["pruned_vs_full_max_abs_diff"] == 0.0
    dec = SpeculativeDecoder(out, strategy="auto", threads=1)
    for prompt in ("def quicksort(items):", "The capital of France is"):
        ref = dec.variant("ar").generate(prompt, max_new_tokens=12).token_ids
        for strategy in ("auto", "tli", "sd", "ngram"):
            assert dec.variant(strategy).generate(prompt, max_new_tokens=12).token_ids == ref, strategy
