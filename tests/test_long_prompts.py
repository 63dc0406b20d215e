"""The long-prompt path on the tiny bundles: last-row logits at prefill, the drafter's bounded window,
prefix reuse across calls, and the fast plain steps; each checked against the exact `ar` output."""
import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from edgespec.export.last_logits import LOGITS_TO_KEEP, strip_logits_to_keep
from edgespec.runtime import Bundle, SpeculativeDecoder
from edgespec.runtime.engine.kv import ModelRunner
from edgespec.runtime.engine.prefix import common_prefix

LONG = ("def quicksort(items):\n    if len(items) <= 1:\n        return list(items)\n    pivot = items[0]\n"
        "The quick brown fox jumps over the lazy dog. Pack my box with five dozen liquor jugs. " * 2)
N = 24


@pytest.fixture(scope="module")
def bundles(tiny_same_bundle, tiny_self_bundle, tiny_hetero_bundle):
    return {"same": Bundle.load(tiny_same_bundle), "self": Bundle.load(tiny_self_bundle),
            "hetero": Bundle.load(tiny_hetero_bundle)}


def _session(path):
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def test_last_rows_equal_the_full_forward(bundles):
    b = bundles["same"]
    ids = b.target.tokenizer.encode(LONG).ids
    runner = ModelRunner(_session(b.target.onnx), "target", exact=True)
    assert runner.keeps_last
    full = runner.forward(ids).copy()
    runner.reset()
    last = runner.forward(ids, last=1)
    assert last.shape == (1, full.shape[1])
    np.testing.assert_allclose(last[0], full[-1], rtol=0, atol=1e-5)
    runner.min_tokens = 2                        # a graph whose 1-row head path differs keeps 2 rows
    runner.reset()
    assert runner.forward(ids, last=1).shape == (1, full.shape[1])
    np.testing.assert_allclose(runner.forward([ids[0]], last=1)[0], runner.forward([ids[0]])[0], atol=1e-5)


def test_stripped_graph_is_the_original(bundles, tiny_same_bundle, copy_bundle):
    b = bundles["same"]
    m = onnx.load(str(b.target.onnx), load_external_data=False)
    assert any(i.name == LOGITS_TO_KEEP for i in m.graph.input)
    assert strip_logits_to_keep(m) and not strip_logits_to_keep(m)
    stripped = copy_bundle(tiny_same_bundle) / "target" / "stripped.onnx"     # beside the same external data
    onnx.save_model(m, str(stripped))
    plain = ModelRunner(_session(stripped), "target")
    edited = ModelRunner(_session(b.target.onnx), "target")
    ids = b.target.tokenizer.encode(LONG).ids[:20]
    assert not plain.keeps_last
    np.testing.assert_allclose(plain.forward(ids, last=1), edited.forward(ids, last=1), atol=1e-5)


def _drafter_lengths(dec) -> list[int]:
    """The drafter's KV length after each of its forwards, appended as they run."""
    seen = []
    forward = dec.drafter.forward

    def observed(ids, *a, **k):
        out = forward(ids, *a, **k)
        seen.append(dec.drafter.length)
        return out
    dec.drafter.forward = observed
    return seen


@pytest.mark.parametrize("name", ["same", "self", "hetero"])
@pytest.mark.parametrize("window", [6, 16])
def test_windowed_drafter_keeps_greedy_identity_and_its_bound(bundles, name, window):
    b = bundles[name]
    ar = SpeculativeDecoder(b, strategy="ar", threads=1, options={"prefix_reuse": False})
    dec = SpeculativeDecoder(b, strategy="tli" if name != "hetero" else "slem", draft_length=3, threads=1,
                             options={"drafter_window": window, "prefix_reuse": False})
    seen = _drafter_lengths(dec)
    res = dec.generate(LONG, max_new_tokens=N)
    assert res.token_ids == ar.generate(LONG, max_new_tokens=N).token_ids
    assert seen and max(seen) <= window
    assert seen[0] <= max(1, window // 4) + 1          # the first fill is a refill (+ a BOS sink), not the window
    st = res.stats
    assert st.draft_prefill_tokens <= st.draft_forwards * window and st.draft_prefill_ms > 0
    assert st.prompt_tokens > window and st.draft_refills >= 1


def test_window_larger_than_the_drafter_context_is_clamped_once(bundles):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dec = SpeculativeDecoder(bundles["same"], strategy="tli", threads=1, options={"drafter_window": 10 ** 6})
    said = [w for w in caught if "drafter_window" in str(w.message)]
    assert len(said) == 1
    assert dec.config.drafter_window == dec.drafter.max_position - dec.config.max_draft_length - 2


def _turns(first_answer: str):
    one = [{"role": "user", "content": "Write a quicksort in Python."}]
    two = one + [{"role": "assistant", "content": first_answer},
                 {"role": "user", "content": "Now explain the pivot choice."}]
    return one, two


@pytest.mark.parametrize("name, strategy", [("same", "ar"), ("same", "tli"), ("self", "auto"),
                                            ("hetero", "slem"), ("hetero", "auto")])
def test_second_turn_reuses_the_prefix_and_equals_a_cold_call(bundles, name, strategy):
    b = bundles[name]
    warm = SpeculativeDecoder(b, strategy=strategy, threads=1)
    cold = SpeculativeDecoder(b, strategy=strategy, threads=1, options={"prefix_reuse": False})
    one, _ = _turns("")
    first = warm.generate(one, max_new_tokens=N, chat=True)
    _, two = _turns(first.text)
    second = warm.generate(two, max_new_tokens=N, chat=True)
    assert second.stats.reused_tokens > len(first.prompt_token_ids) // 2
    assert second.stats.reused_tokens == min(common_prefix(first.prompt_token_ids + first.token_ids,
                                                           second.prompt_token_ids), len(second.prompt_token_ids) - 1)
    expect = cold.generate(two, max_new_tokens=N, chat=True)
    assert expect.stats.reused_tokens == 0
    assert second.token_ids == expect.token_ids
    if strategy in ("tli", "slem"):    # the window's unreused part is a fill, booked as one
        assert second.stats.draft_prefill_tokens > 0 and second.stats.draft_prefill_ms > 0
    again = warm.generate(two, max_new_tokens=N, chat=True)       # the same conversation asked again
    assert again.token_ids == expect.token_ids and again.stats.reused_tokens == len(again.prompt_token_ids) - 1


def test_an_interrupted_stream_leaves_nothing_to_reuse(bundles):
    b = bundles["same"]
    dec = SpeculativeDecoder(b, strategy="tli", draft_length=2, threads=1)
    cold = SpeculativeDecoder(b, strategy="tli", draft_length=2, threads=1, options={"prefix_reuse": False})
    stream = dec.stream(LONG, max_new_tokens=N)
    next(stream)
    stream.close()
    res = dec.generate(LONG, max_new_tokens=N)
    assert res.stats.reused_tokens == 0
    assert res.token_ids == cold.generate(LONG, max_new_tokens=N).token_ids
    assert dec.generate(LONG, max_new_tokens=N).stats.reused_tokens == len(res.prompt_token_ids) - 1


def test_a_superseded_stream_leaves_nothing_to_reuse(bundles):
    dec = SpeculativeDecoder(bundles["same"], strategy="tli", draft_length=2, threads=1)
    dec.generate(LONG, max_new_tokens=4)
    stream = dec.stream(LONG, max_new_tokens=N)
    next(stream)                                     # started: the KV no longer holds what was recorded
    assert dec.shared.prefix.target_ids is None
    stream.close()


def test_fast_plain_steps_skip_the_padding(bundles):
    b = bundles["same"]
    exact = SpeculativeDecoder(b, strategy="ar", threads=1, options={"prefix_reuse": False})
    fast = exact.variant("ar", plain_steps="fast")
    for dec in (exact, fast):
        dec.target.min_tokens = 2                # as an int4 graph with a separate 1-token path declares
    try:
        fed = exact.target.tokens_fed
        a = exact.generate(LONG, max_new_tokens=8)
        padded = exact.target.tokens_fed - fed
        fed = fast.target.tokens_fed
        f = fast.generate(LONG, max_new_tokens=8)
        unpadded = fast.target.tokens_fed - fed
    finally:
        exact.target.min_tokens = 1
    assert padded - unpadded == 7                # one pad position per plain step after the prefill
    assert a.token_ids == f.token_ids            # this fp32 graph computes the same on both paths


@pytest.mark.parametrize("name", ["same", "hetero"])
def test_a_short_prompt_fills_the_window_bounded_too(bundles, name):
    """A prompt shorter than the window but longer than a quarter of it: the first fill feeds its last
    window // 4 tokens (+ a BOS sink), then the window grows with the text; output equal to ar's."""
    b, window = bundles[name], 64
    ar = SpeculativeDecoder(b, strategy="ar", threads=1, options={"prefix_reuse": False})
    dec = SpeculativeDecoder(b, strategy="tli" if name != "hetero" else "slem", draft_length=3, threads=1,
                             options={"drafter_window": window, "prefix_reuse": False})
    prompt = LONG[:120]
    seen = _drafter_lengths(dec)
    res = dec.generate(prompt, max_new_tokens=N)
    assert window // 4 < res.stats.prompt_tokens < window
    assert res.token_ids == ar.generate(prompt, max_new_tokens=N).token_ids
    assert seen[0] <= window // 4 + 1 and max(seen) > seen[0] and res.stats.draft_refills == 0


@pytest.mark.parametrize("strategy", ["ngram", "auto"])
def test_a_draft_kept_past_eos_leaves_the_prefix_reusable(bundles, strategy):
    """The answer store drafts an earlier answer past the token that ends this one (an agent's answer,
    stored with the prompt that followed it: `</tool_call><|im_end|>\\n<|im_start|>...`), and the target keeps
    drafts after it: the KV then holds positions past the output's ids. They are cropped at the end, so
    the next call still reuses the prompt's KV (it reused nothing while the KV and its ids disagreed)."""
    dec = SpeculativeDecoder(bundles["self"], strategy=strategy, threads=1)
    first = dec.generate(LONG, max_new_tokens=N)            # recorded in the answer store
    ids = first.token_ids
    end = next(i for i in range(N // 2, N - 2) if ids[i] not in ids[:i])     # a token new at i: the new EOS
    dec.shared.eos_ids = frozenset({ids[end]})
    again = dec.generate(LONG, max_new_tokens=N)             # the store drafts the answer through the new EOS
    assert again.stats.stop_reason == "eos" and again.token_ids == ids[:end + 1]
    assert again.stats.store_accepted > again.stats.store_drafted // 2
    assert dec.shared.target.length <= len(again.prompt_token_ids) + len(again.token_ids)
    third = dec.generate(LONG, max_new_tokens=N)
    assert third.stats.reused_tokens == len(third.prompt_token_ids) - 1
    assert third.token_ids == again.token_ids
