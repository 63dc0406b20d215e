"""The padded-attention graph (export/padded_attention.py, runtime/engine/kv.py `pad_rows`): exact 1-token steps
without padding the whole forward. A tiny builder int4 pair whose 1-token forwards differ from wider ones
by 2e-6 (GroupQueryAttention's 1-query path): exported with the batch-invariance tolerance at 0, so the
export asks for padded steps. The export writes the padded-attention graph whatever its check finds (on an
AVX2 EPYC without VNNI it differs from padded steps even on this tiny model): tests that need it to be
exact on this CPU check for that property (`padded_exact_here`) and skip naming it where it is missing."""
import json
from pathlib import Path

import numpy as np
import onnx
import pytest

from distribution import ALPHA, check_lossless  # tests/ is on sys.path (conftest.py)
from edgespec.errors import BundleError
from edgespec.export.padded_attention import PADDED_GRAPH, check_padded_graph
from edgespec.runtime import Bundle, SpeculativeDecoder
from edgespec.runtime.engine.kv import MIN_TOKENS_KEY, PAD_ROWS_KEY, ModelRunner
from edgespec.runtime.engine.sessions import create_session

PROMPT = "def add(a, b):\n    return a + b\n\nclass Stack:\n    def push(self, item):"


@pytest.fixture(scope="module")
def padded_bundle(tiny_padded_bundle) -> Path:
    return tiny_padded_bundle


@pytest.fixture(scope="module")
def padded_diff_here(padded_bundle) -> float:
    """This CPU's max |diff| between the padded-attention graph and model.onnx's padded steps."""
    ids = np.asarray(Bundle.load(padded_bundle).target.tokenizer.encode(PROMPT).ids, dtype=np.int64)[:28]
    return check_padded_graph(padded_bundle / "target", ids)


@pytest.fixture
def padded_exact_here(padded_diff_here) -> None:
    if padded_diff_here != 0.0:
        pytest.skip(f"this CPU lacks the property: the padded-attention graph computes other logits than padded "
                    f"steps here (max |diff| {padded_diff_here:.3g}; int8-activation kernels not batch-invariant)")


def _runner(path: Path, **kw) -> ModelRunner:
    return ModelRunner(create_session(path, "cpu", threads=1)[0], "target", **kw)


def test_export_writes_a_listed_graph_that_only_pads_attention(padded_bundle, padded_diff_here):
    """Written and listed whatever the export's check found; the check is recorded as information."""
    target = padded_bundle / "target"
    man = json.loads((padded_bundle / "manifest.json").read_text())
    assert man["target"]["min_forward_tokens"] == 2 and f"target/{PADDED_GRAPH}" in man["files"]
    recorded = man["checks"]["padded_attention_vs_padded_steps_max_abs_diff"]
    assert isinstance(recorded, float) and recorded == padded_diff_here      # exported on this machine
    g = onnx.load(str(target / PADDED_GRAPH), load_external_data=False)
    meta = {p.key: p.value for p in g.metadata_props}
    assert meta[PAD_ROWS_KEY] == "1" and MIN_TOKENS_KEY not in meta
    ops = [n.op_type for n in g.graph.node]
    base = [n.op_type for n in onnx.load(str(target / "model.onnx"), load_external_data=False).graph.node]
    assert ops.count("Concat") - base.count("Concat") == base.count("GroupQueryAttention") == 2
    want = target / (PADDED_GRAPH if recorded == 0.0 else "model.onnx")     # the export's plan
    assert Bundle.load(padded_bundle, verify="full").target.runtime_onnx == want


def test_a_graph_the_export_found_inexact_is_not_run_without_a_profile(padded_bundle, copy_bundle):
    """An export whose check failed (as on an AVX2 EPYC): the runtime pads model.onnx's steps, exact."""
    b = copy_bundle(padded_bundle)
    man = json.loads((b / "manifest.json").read_text())
    man["checks"]["padded_attention_vs_padded_steps_max_abs_diff"] = 0.583
    (b / "manifest.json").write_text(json.dumps(man))
    dec = SpeculativeDecoder(b, strategy="tli", draft_length="auto", threads=1)
    assert dec.planning.plan.step_graph == "model" and dec.planning.plan.source == "export"
    assert dec.target.min_tokens == 2 and dec.target.pad_rows == 0
    want = dec.variant("ar").generate(PROMPT, max_new_tokens=30).token_ids
    assert dec.generate(PROMPT, max_new_tokens=30).token_ids == want


@pytest.mark.parametrize("kv", ["auto", "copy"])
def test_every_width_computes_what_a_padded_step_computes(padded_bundle, kv, padded_exact_here):
    """1-token forwards without padding the MLPs, widths 2 and 3, and the KV left behind: logits equal to
    model.onnx's padded steps, over 30 steps (shared buffers and the copying layout)."""
    target = padded_bundle / "target"
    ids = np.asarray(Bundle.load(padded_bundle).target.tokenizer.encode(PROMPT).ids, dtype=np.int64)
    ref = _runner(target / "model.onnx", kv=kv)
    assert ref.min_tokens == 2 and ref.pad_rows == 0
    twin = _runner(target / PADDED_GRAPH, kv=kv)
    assert twin.min_tokens == 1 and twin.pad_rows == 1
    for width in (1, 2, 3):
        ref.reset(), twin.reset()
        np.testing.assert_array_equal(twin.forward(ids[:8]), ref.forward(ids[:8]))
        for i in range(8, ids.size, width):
            chunk = ids[i:i + width]
            want = np.concatenate([ref.forward(chunk[j:j + 1]).copy() for j in range(chunk.size)])
            np.testing.assert_array_equal(twin.forward(chunk), want)
        assert twin.length == ref.length == ids.size
    twin.crop(10)                      # a rollback, then on: the extra KV position never counts
    ref.crop(10)
    np.testing.assert_array_equal(twin.forward(ids[10:12]), ref.forward(ids[10:12]))


def test_the_check_measures_the_difference(padded_bundle, padded_diff_here, padded_exact_here):
    assert padded_diff_here == 0.0
    b = Bundle.load(padded_bundle).target
    ids = np.asarray(b.tokenizer.encode(PROMPT).ids, dtype=np.int64)[:28]
    sabotaged = _runner(b.onnx)            # model.onnx's 1-token steps unpadded: the 1-query path differs
    assert sabotaged.min_tokens == 2
    sabotaged.min_tokens = 1
    ref = _runner(b.onnx)
    sabotaged.forward(ids[:16]), ref.forward(ids[:16])
    diffs = [float(np.abs(sabotaged.forward(ids[i:i + 1]) - ref.forward(ids[i:i + 1])).max()) for i in range(16, 28)]
    assert max(diffs) > 0.0               # the difference the check would see, had the graph kept it


def test_greedy_speculation_on_it_equals_ar_and_the_padded_graph(padded_bundle, copy_bundle, padded_exact_here):
    dec = SpeculativeDecoder(padded_bundle, strategy="tli", draft_length="auto", threads=1)
    assert dec.target.pad_rows == 1 and dec.target.min_tokens == 1
    ar = dec.variant("ar")
    old = copy_bundle(padded_bundle)                 # the same bundle without the graph: padded steps
    (old / "target" / PADDED_GRAPH).unlink()
    man = json.loads((old / "manifest.json").read_text())
    del man["files"][f"target/{PADDED_GRAPH}"]
    (old / "manifest.json").write_text(json.dumps(man))
    padded = SpeculativeDecoder(old, strategy="ar", threads=1)
    assert padded.target.min_tokens == 2 and padded.target.pad_rows == 0
    for prompt in (PROMPT, "The quick brown fox"):
        want = ar.generate(prompt, max_new_tokens=40).token_ids
        assert padded.generate(prompt, max_new_tokens=40).token_ids == want
        for variant in (dec, dec.variant("auto"), dec.variant("ngram"), dec.variant("tli", draft_length=3)):
            assert variant.generate(prompt, max_new_tokens=40).token_ids == want


def test_plain_steps_guess_where_the_governor_says_it_pays(padded_bundle, monkeypatch, padded_exact_here):
    """1-token steps are not padded on this graph, so a guess widens the forward: the governor decides (at
    first it guesses); with a fixed draft length nothing guesses. Either way the output is ar's."""
    from edgespec.runtime.round import governor
    monkeypatch.setattr(governor.Governor, "choose", lambda self, limit: 0)   # every round a plain step
    dec = SpeculativeDecoder(padded_bundle, strategy="tli", draft_length="auto", threads=1)
    prompt = PROMPT * 3
    want = dec.variant("ar").generate(prompt, max_new_tokens=30).token_ids
    res = dec.generate(prompt, max_new_tokens=30)
    assert dec.target.min_tokens == 1 and res.token_ids == want and res.stats.guesses > 0
    fixed = dec.variant("tli", draft_length=3, plain_guess=True)
    assert fixed.generate(prompt, max_new_tokens=30).stats.guesses == 0


def test_sampling_on_it_keeps_the_target_distribution(padded_bundle):
    b = Bundle.load(padded_bundle)
    dec = SpeculativeDecoder(b, strategy="tli", draft_length=4, threads=1)
    pvals = check_lossless(dec, b, b.target.tokenizer.encode("The quick brown").ids, n=2000, seed=0, temperature=1.0)
    assert min(pvals.values()) > ALPHA, pvals


def test_an_unlisted_padded_graph_is_refused(padded_bundle, copy_bundle):
    b = copy_bundle(padded_bundle)
    man = json.loads((b / "manifest.json").read_text())
    del man["files"][f"target/{PADDED_GRAPH}"]
    (b / "manifest.json").write_text(json.dumps(man))
    with pytest.raises(BundleError, match="padded"):
        Bundle.load(b, verify="none")


def test_a_reused_prefix_gives_the_cold_calls_tokens(padded_bundle):
    """Prefix reuse over a KV cache that the graph wrote one extra position into at every forward."""
    dec = SpeculativeDecoder(padded_bundle, strategy="auto", threads=1)
    first = dec.generate(PROMPT, max_new_tokens=20)
    follow = first.prompt_token_ids + first.token_ids + dec.encode_prompt("\n# and a test for it\n")
    reused = dec.generate(follow, max_new_tokens=20)
    assert reused.stats.reused_tokens > len(first.prompt_token_ids)
    cold = SpeculativeDecoder(padded_bundle, strategy="auto", threads=1, options={"prefix_reuse": False}).generate(
        follow, max_new_tokens=20)
    assert reused.token_ids == cold.token_ids
