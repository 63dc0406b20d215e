"""export/last_logits.py on real builder graphs: the rows are cut right after the last attention, the
kept rows and every position's KV keep their bits, and graphs it cannot prove row-wise keep the cut
before the head."""
import numpy as np
import onnx
import onnxruntime as ort
import pytest

from edgespec.export.graph_info import find_head
from edgespec.export.last_logits import LOGITS_TO_KEEP, add_logits_to_keep, strip_logits_to_keep

PREFIX = "edgespec/last_logits/"


def _cuts(model):
    return [n for n in model.graph.node if n.name.startswith(PREFIX) and n.op_type == "Slice"]


def _load(bundle, side):
    return onnx.load(str(bundle / side / "model.onnx"), load_external_data=False)


def _feeds(session, ids, keep=None):
    feeds = {"input_ids": np.asarray([ids], np.int64), "attention_mask": np.ones((1, len(ids)), np.int64)}
    for i in session.get_inputs():
        if i.name.startswith("past_key_values"):
            feeds[i.name] = np.zeros((1, i.shape[1], 0, i.shape[3]), np.float32)
        elif i.name == "position_ids":
            feeds[i.name] = np.arange(len(ids), dtype=np.int64)[None]
    if keep is not None:
        feeds[LOGITS_TO_KEEP] = np.array([keep], np.int64)
    return feeds


@pytest.mark.parametrize("side", ["target", "drafter"])
def test_the_cut_follows_the_last_attention(tiny_same_bundle, side):
    m = _load(tiny_same_bundle, side)
    attention = [n for n in m.graph.node if n.op_type == "GroupQueryAttention"][-1]
    cuts = _cuts(m)
    sources = {n.input[0] for n in cuts}
    assert len(cuts) == 2 and attention.output[0] in sources      # attention's output and the residual
    head = find_head(m.graph)[0]
    assert head.input[0] not in sources                             # not the old cut before the head
    assert strip_logits_to_keep(m) and not _cuts(m) and not strip_logits_to_keep(m)
    assert LOGITS_TO_KEEP not in {i.name for i in m.graph.input}
    assert add_logits_to_keep(m) and len(_cuts(m)) == 2 and not add_logits_to_keep(m)


@pytest.mark.parametrize("bundle_name", ["tiny_same_bundle", "tiny_int4_bundle"])
def test_kept_rows_and_kv_keep_their_bits(bundle_name, request, copy_bundle):
    root = copy_bundle(request.getfixturevalue(bundle_name))
    m = _load(root, "target")
    strip_logits_to_keep(m)
    plain_path = root / "target" / "plain.onnx"                    # beside the same external data
    onnx.save_model(m, str(plain_path))
    plain = ort.InferenceSession(str(plain_path), providers=["CPUExecutionProvider"])
    cut = ort.InferenceSession(str(root / "target" / "model.onnx"), providers=["CPUExecutionProvider"])
    ids = [(7 * i + 3) % 90 + 5 for i in range(19)]
    names = ["logits"] + [o.name for o in plain.get_outputs() if o.name.startswith("present.")]
    full = plain.run(names, _feeds(plain, ids))
    for keep in (2, 5, 0):
        out = cut.run(names + ["next_ids"], _feeds(cut, ids, keep))
        rows = full[0][:, -keep:] if keep else full[0]
        assert out[0].shape == rows.shape
        np.testing.assert_array_equal(out[0], rows)                 # bit for bit, every kept row
        np.testing.assert_array_equal(out[-1], rows.argmax(-1))     # the graph's greedy ids (greedy_ids.py)
        for got, want in zip(out[1:-1], full[1:]):                  # every position's KV, every layer
            np.testing.assert_array_equal(got, want)


def test_a_graph_it_cannot_prove_row_wise_keeps_the_cut_before_the_head(tiny_same_bundle):
    m = _load(tiny_same_bundle, "target")
    strip_logits_to_keep(m)
    attention = [n for n in m.graph.node if n.op_type == "GroupQueryAttention"][-1]
    after = [n for n in m.graph.node if attention.output[0] in n.input][0]
    after.op_type = "Softmax"          # not on the allow list (it would not run: only the edit is looked at)
    assert add_logits_to_keep(m)
    cuts = _cuts(m)
    assert len(cuts) == 1 and cuts[0].output[0] in find_head(m.graph)[0].input


def test_a_tensor_from_before_the_cut_that_no_row_wise_node_made_keeps_the_cut_before_the_head(tiny_same_bundle):
    """A per-position table (here: the last layer's residual, rerouted through a Gather) is not a row
    of the residual stream: slicing it like one could be wrong, so the edit does not try."""
    from onnx import helper, numpy_helper

    m = _load(tiny_same_bundle, "target")
    strip_logits_to_keep(m)
    attention = [n for n in m.graph.node if n.op_type == "GroupQueryAttention"][-1]
    after = [n for n in m.graph.node if attention.output[0] in n.input][0]       # o_proj
    norm = [n for n in m.graph.node if after.output[0] in n.input][0]            # adds the residual stream
    residual = next(i for i in norm.input if i != after.output[0] and i and "weight" not in i)
    m.graph.initializer.append(numpy_helper.from_array(np.array(0, np.int64), "test/zero"))
    m.graph.node.insert(list(m.graph.node).index(norm), helper.make_node(
        "Gather", [residual, "test/zero"], ["test/table"], name="test/gather", axis=0))
    norm.input[list(norm.input).index(residual)] = "test/table"
    assert add_logits_to_keep(m)
    cuts = _cuts(m)
    assert len(cuts) == 1 and cuts[0].output[0] in find_head(m.graph)[0].input
