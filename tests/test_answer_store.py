"""The answer store (runtime/samplers/answer_store.py): earlier answers draft for later requests, free, beside the
prompt lookup. The structure (hashes, the longest match, draft length following the match, scopes,
bounded memory with oldest-first eviction), and on the tiny bundles: greedy output still equals `ar`
(ngram, auto), a second identical request drafts from the store, scopes never share, an interrupted
stream records nothing, the server's key scoping and --no-cross-request, the target's law at T > 0 with
the store drafting (and a broken verifier failing the same test), one-line errors for bad settings."""
import hashlib
import tracemalloc

import numpy as np
import pytest

from distribution import ALPHA, REJECTION, check_lossless, sample_tokens, verify_without_residual  # tests/ on sys.path
from edgespec.errors import GenerationError
from edgespec.runtime import Bundle, SpeculativeDecoder
from edgespec.runtime.round import rounds as rounds_module
from edgespec.runtime.samplers.answer_store import (MAX_STORE_DRAFT, MIN_STORE_BYTES, ORDERS, PROMPT_TAIL, AnswerStore,
                                           check_store_mb, ngram_hashes, scope_key, suffix_hashes)
from edgespec.runtime.samplers.sampling import SamplingParams

PROMPT = "Once upon a time"          # the tiny models' answers to it repeat little of it


def _doc(rng, n):
    return rng.integers(0, 50_000, n).tolist()


# --------------------------------------------------------------------------- the structure

def test_a_rounds_hashes_equal_the_recorded_ones():
    t = np.random.default_rng(0).integers(0, 1000, 40)
    for salt in (0, scope_key("a")):
        recorded = ngram_hashes(t, salt)
        for n in ORDERS:
            for e in range(n, t.size):
                assert suffix_hashes(t[:e].tolist(), salt)[n] == int(recorded[n][e - n])


def test_the_longest_match_drafts_and_the_draft_follows_its_length():
    rng = np.random.default_rng(1)
    store = AnswerStore(1 << 20)
    prompt, answer = _doc(rng, 10), _doc(rng, 100)
    store.record(prompt, answer)
    got, m = store.lookup(answer[:40], 8)
    assert got == answer[40:48] and m == 40          # matched all 40 tokens (the tail is 40 long)
    fresh = _doc(rng, 20)
    got, m = store.lookup(fresh + answer[10:13], 8)  # only 3 tokens match: a 3-token draft
    assert (got, m) == (answer[13:16], 3)
    assert store.lookup(fresh + answer[10:12], 8) == ([], 0)     # 2 tokens: no order that short
    assert store.lookup(answer[:98], 8)[0] == answer[98:]      # never past the answer's end
    assert store.lookup(prompt[-5:] + answer[:1], 4)[0] == answer[1:5]   # the prompt's tail leads in


def test_the_latest_occurrence_wins():
    rng = np.random.default_rng(2)
    store = AnswerStore(1 << 20)
    head, a, b = _doc(rng, 20), _doc(rng, 10), _doc(rng, 10)
    store.record([], head + a)
    store.record([], head + b)
    assert store.lookup(head, 5)[0] == b[:5]


def test_scopes_never_draft_for_each_other():
    rng = np.random.default_rng(3)
    store = AnswerStore(1 << 20)
    answer = _doc(rng, 60)
    store.record([], answer, scope="key:A")
    assert store.lookup(answer[:30], 8, scope="key:A")[0] == answer[30:38]
    for other in ("key:B", None, ""):
        assert store.lookup(answer[:30], 8, scope=other) == ([], 0)


def test_memory_is_bounded_and_the_oldest_answers_go_first():
    rng = np.random.default_rng(4)
    docs = [_doc(rng, 300) for _ in range(60)]       # far more tokens than it holds
    prompts = [_doc(rng, 100) for _ in docs]
    tracemalloc.start()
    store = AnswerStore(MIN_STORE_BYTES * 2)
    for p, d in zip(prompts, docs):
        store.record(p, d)
    held, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert store.nbytes <= store.max_bytes and store.capacity * 2 < sum(map(len, docs))
    assert store.evicted > 0 and len(store) < len(docs)
    assert held < store.max_bytes * 1.1              # what it keeps: its arrays and the documents' bounds
    assert store.lookup(docs[0][:40], 8) == ([], 0)  # evicted
    assert store.lookup(docs[-1][:40], 8)[0] == docs[-1][40:48]
    kept = len(store)
    assert all(store.lookup(d[:40], 8)[0] == d[40:48] for d in docs[-kept:])


def test_an_answer_longer_than_the_store_keeps_its_end():
    store = AnswerStore(MIN_STORE_BYTES)
    long = list(range(5, 5 + store.capacity + 500))
    store.record([1, 2, 3], long)
    assert len(store) == 1 and store.lookup(long[-40:-10], 4)[0] == long[-10:-6]


def test_a_match_is_followed_across_rounds_while_the_text_goes_on():
    rng = np.random.default_rng(5)
    store = AnswerStore(1 << 20)
    answer = _doc(rng, 80)
    store.record([], answer)
    match = store.find(answer[:20])
    assert (match.m, store.continuation(match, 5)) == (20, answer[20:25])
    on = store.follow(match, answer[20:27])          # the output went on as the answer did: no new lookup
    assert (on.m, store.continuation(on, 5)) == (27, answer[27:32])
    assert store.follow(match, answer[20:26] + [answer[26] + 1]) is None       # it diverged
    assert store.follow(on, answer[27:]) is None                               # nothing left after it
    store.clear()
    assert store.follow(match, answer[20:21]) is None                          # the answer is gone


def test_the_draft_length_follows_the_cost_model():
    store = AnswerStore(1 << 20)
    assert store.draft_length(16) is None            # no cost curve yet: the caller keeps to its gamma
    for width, ms in ((1, 40.0), (2, 44.0), (3, 48.0)):     # wide verifies cost little: long drafts pay
        store.observe(width, ms)
    for _ in range(50):
        store.book(10, 10)                             # and store drafts are all kept
    assert store.acceptance() > 0.95 and store.draft_length(16) == 16 and store.draft_length(1) == 1
    steep = AnswerStore(1 << 20)
    steep_ms = [40.0, 80.0, 120.0]                    # the device profile's curve: each token costs a step
    for _ in range(50):
        steep.book(4, 1)                               # half the positions reached are rejected
    assert steep.acceptance() < 0.6 and steep.draft_length(16, steep_ms) == 1
    assert list(steep.costs(5, steep_ms)) == [40.0, 80.0, 120.0, 160.0, 200.0]     # extended past its widths
    middle = AnswerStore(1 << 20)
    zen4_ms = [34.4, 44.5, 56.6, 66.9, 80.2, 93.0, 108.9, 119.9, 134.7]   # docs/results.md
    lengths = [middle.draft_length(MAX_STORE_DRAFT, zen4_ms)]
    for _ in range(100):
        middle.book(10, 10)
        lengths.append(middle.draft_length(MAX_STORE_DRAFT, zen4_ms))
    assert lengths[0] < lengths[-1] <= MAX_STORE_DRAFT and lengths == sorted(lengths)   # more kept: longer


@pytest.mark.parametrize("bad", [-1, 0.01, 1e9, "32", True, float("nan"), None])
def test_a_bad_store_size_is_one_line(bad):
    with pytest.raises(GenerationError, match="answer_store_mb must be 0") as e:
        check_store_mb(bad)
    assert "\n" not in str(e.value)
    with pytest.raises(GenerationError, match="answer_store_mb"):       # before the bundle is even read
        SpeculativeDecoder("/nonexistent/bundle", options={"answer_store_mb": bad})


# --------------------------------------------------------------------------- in the decoder (tiny bundles)

@pytest.fixture(scope="module")
def self_bundle(tiny_self_bundle):
    return Bundle.load(tiny_self_bundle)


@pytest.mark.parametrize("strategy", ["ngram", "auto"])
def test_greedy_output_equals_ar_with_the_store_drafting(self_bundle, strategy):
    dec = SpeculativeDecoder(self_bundle, strategy=strategy, threads=1)
    ar = dec.variant("ar")
    prompts = ["The quick brown fox. The quick brown", "def add(a, b):\n    return a + b\n\ndef add(", PROMPT]
    refs = {p: ar.generate(p, max_new_tokens=32, draft_scope="ar").token_ids for p in prompts}
    drafted = 0
    for _ in range(2):                                # the second pass drafts from the first's answers
        for p in prompts:
            res = dec.generate(p, max_new_tokens=32)
            assert res.token_ids == refs[p], (strategy, p)
            drafted += res.stats.store_drafted
    assert drafted > 0


def test_a_second_identical_request_drafts_from_the_store(self_bundle):
    dec = SpeculativeDecoder(self_bundle, strategy="ngram", draft_length=4, threads=1)
    first = dec.generate(PROMPT, max_new_tokens=40)
    second = dec.generate(PROMPT, max_new_tokens=40)
    assert second.token_ids == first.token_ids
    assert first.stats.store_drafted == 0 and second.stats.store_accepted >= 30
    assert second.stats.accepted > first.stats.accepted
    assert second.stats.verify_forwards < first.stats.verify_forwards / 2
    assert dec.variant("ngram").generate(PROMPT, max_new_tokens=40).stats.store_accepted >= 30   # variants share it


def test_a_store_draft_is_sized_by_its_match_not_the_draft_length(self_bundle):
    dec = SpeculativeDecoder(self_bundle, strategy="ngram", draft_length=2, threads=1)
    ar = dec.variant("ar").generate(PROMPT, max_new_tokens=48, draft_scope="ar").token_ids
    first = dec.generate(PROMPT, max_new_tokens=48)
    second = dec.generate(PROMPT, max_new_tokens=48)
    assert first.token_ids == second.token_ids == ar
    assert max(first.stats.drafted_per_step) <= 2 < max(second.stats.drafted_per_step)
    assert second.stats.store_accepted >= 30 and second.stats.verify_forwards < first.stats.verify_forwards / 2


def test_another_scope_and_a_store_turned_off_draft_nothing_from_it(self_bundle):
    dec = SpeculativeDecoder(self_bundle, strategy="ngram", draft_length=4, threads=1)
    dec.generate(PROMPT, max_new_tokens=40, draft_scope="key:A")
    assert dec.generate(PROMPT, max_new_tokens=40, draft_scope="key:B").stats.store_drafted == 0
    assert dec.generate(PROMPT, max_new_tokens=40, draft_scope="key:A").stats.store_accepted >= 30
    off = SpeculativeDecoder(self_bundle, strategy="ngram", draft_length=4, threads=1,
                             options={"answer_store_mb": 0})
    off.generate(PROMPT, max_new_tokens=40)
    assert off.generate(PROMPT, max_new_tokens=40).stats.store_drafted == 0
    assert off.shared.answers.nbytes == 0 and len(off.shared.answers) == 0
    with pytest.raises(GenerationError, match="draft_scope must be a str"):
        dec.generate(PROMPT, max_new_tokens=4, draft_scope=7)


def test_an_interrupted_stream_records_nothing(self_bundle):
    dec = SpeculativeDecoder(self_bundle, strategy="ngram", draft_length=4, threads=1)
    ref = dec.variant("ar").generate(PROMPT, max_new_tokens=40, draft_scope="ar").token_ids
    stream = dec.stream(PROMPT, max_new_tokens=40)
    next(stream)
    next(stream)
    stream.close()                                    # the client went away
    assert dec.last_result.stats.stop_reason == "interrupted" and len(dec.shared.answers) == 1   # ar's only
    res = dec.generate(PROMPT, max_new_tokens=40)
    assert res.token_ids == ref and res.stats.store_drafted == 0


def test_the_server_scopes_the_store_by_key_and_can_turn_it_off(self_bundle):
    starlette = pytest.importorskip("starlette.testclient")
    from edgespec.serve.app import Settings, build_app
    from edgespec.serve.cli import register
    from edgespec.serve.server import make_decoder
    from edgespec.serve.worker import Worker
    dec = SpeculativeDecoder(self_bundle, strategy="ngram", draft_length=4, threads=1)
    worker = Worker(dec)
    try:
        client = starlette.TestClient(build_app(worker, Settings(model="m", api_key="k1")), base_url="http://127.0.0.1")
        r = client.post("/v1/completions", json={"model": "m", "prompt": PROMPT, "max_tokens": 8},
                        headers={"Authorization": "Bearer k1"})
        assert r.status_code == 200, r.text
    finally:
        worker.shutdown()
        worker.join(timeout=5)
    (doc,) = dec.shared.answers.docs.values()
    assert doc[2] == scope_key("key:" + hashlib.sha256(b"k1").hexdigest())
    import argparse
    sub = argparse.ArgumentParser().add_subparsers()
    register(sub)
    args = sub.choices["serve"].parse_args(["--bundle", str(self_bundle.path), "--no-cross-request", "--threads", "1"])
    assert make_decoder(self_bundle, args).shared.answers.enabled is False


# --------------------------------------------------------------------------- the target's law at T > 0

N = 2000
PARAMS = SamplingParams(temperature=0.5)     # peaked enough that a broken verifier shows


def _sampled(self_bundle, monkeypatch, verifier=None):
    """Samples of 4 tokens from an ngram decoder whose store holds earlier samples of the same prompt
    (so from the second run on, most rounds draft the store's continuation of prompt + x1)."""
    dec = SpeculativeDecoder(self_bundle, strategy="ngram", draft_length=2, threads=1, options=REJECTION)
    if verifier is not None:
        monkeypatch.setattr(rounds_module, "verify_sampled", verifier)
    ids = dec.encode_prompt(PROMPT)
    assert len(ids) < PROMPT_TAIL
    drafted = []
    orig = dec.generate

    def generate(*a, **k):
        res = orig(*a, **k)
        drafted.append(res.stats.store_drafted)
        return res
    dec.generate = generate
    samples = sample_tokens(dec, ids, N, 0, PARAMS)
    return dec, ids, samples, drafted


def test_the_store_drafting_keeps_the_targets_law(self_bundle, monkeypatch):
    dec, ids, samples, drafted = _sampled(self_bundle, monkeypatch)
    assert np.mean(np.asarray(drafted) > 0) > 0.5, "the store drafted too rarely for the test to mean anything"
    pvals = check_lossless(dec, self_bundle, ids, samples=samples, temperature=PARAMS.temperature)
    assert min(pvals.values()) > ALPHA, pvals


def test_a_broken_verifier_fails_the_same_test(self_bundle, monkeypatch):
    dec, ids, samples, drafted = _sampled(self_bundle, monkeypatch, verify_without_residual)
    pvals = check_lossless(dec, self_bundle, ids, samples=samples, temperature=PARAMS.temperature)
    assert pvals["x2"] < ALPHA, pvals
    assert pvals["x1"] > ALPHA          # the first token comes from the prefill: untouched by verify
