"""`slrs1` (runtime/round/slrs.py): SLRS with one drafter token of lookahead, on the tiny heterogeneous bundle
(byte-level target, SentencePiece drafter). The strategy is registered here for the test; the
registry line for strategies.py is in docs/study-real-pairs.md."""
from __future__ import annotations

import numpy as np
import pytest

from distribution import ALPHA, REJECTION, check_lossless, sample_tokens  # tests/ is on sys.path (conftest.py)
from edgespec.runtime import Bundle, SpeculativeDecoder
from edgespec.runtime.round import rounds as rounds_module
from edgespec.runtime.round import slrs
from edgespec.runtime.samplers.sampling import SamplingParams, sample
from edgespec.runtime.round.strategies import STRATEGIES
from edgespec.runtime.samplers.tli import tli_distribution
from edgespec.runtime.bundle.vocab import token_table

PROMPT = "The quick brown fox. The quick brown"


@pytest.fixture
def slrs1():
    """The registered strategy (runtime/round/strategies.py), not a test-local copy."""
    assert STRATEGIES["slrs1"].greedy is slrs.greedy and STRATEGIES["slrs1"].prepare is slrs.prepare


def test_first_token_map_is_the_longest_target_prefix(tiny_hetero_bundle):
    b = Bundle.load(tiny_hetero_bundle)
    first = slrs.first_token_map(b)
    t_keys = token_table(b.target.tokenizer, b.target.vocab_size).text_keys()
    d_keys = token_table(b.drafter.tokenizer, b.drafter.vocab_size).text_keys()
    same = b.index_map >= 0
    np.testing.assert_array_equal(first[same], b.index_map[same])        # a shared string maps to itself
    assert (first >= 0).sum() > same.sum()                               # columns TLI drops now propose
    for col, t in enumerate(first):
        key = d_keys[b.draft_ids[col]]
        if key and t >= 0:
            assert key.startswith(t_keys[t])
            assert not any(k and key.startswith(k) and len(k) > len(t_keys[t]) for k in t_keys)


def test_psi_1_adds_the_mass_tli_drops(tiny_hetero_bundle):
    b = Bundle.load(tiny_hetero_bundle)
    state = slrs.prepare(b, {})
    rng = np.random.default_rng(0)
    logits = rng.normal(0, 3, b.index_map.size).astype(np.float32)
    params = SamplingParams(temperature=1.0)
    psi = tli_distribution(state, logits, params, np.zeros(b.target.vocab_size))
    q = np.exp(logits - logits.max())
    q /= q.sum()
    first = slrs.first_token_map(b)
    want = np.bincount(first[first >= 0], weights=q[first >= 0], minlength=b.target.vocab_size)
    np.testing.assert_allclose(psi, want / want.sum(), atol=1e-6)
    assert slrs.greedy(state, logits) == int(np.argmax(psi))


def test_greedy_output_equals_ar(tiny_hetero_bundle, slrs1):
    b = Bundle.load(tiny_hetero_bundle)
    ref = SpeculativeDecoder(b, strategy="ar", threads=1).generate(PROMPT, max_new_tokens=16).token_ids
    out = SpeculativeDecoder(b, strategy="slrs1", draft_length=3, threads=1).generate(PROMPT, max_new_tokens=16)
    assert out.token_ids == ref and out.stats.drafted > 0


def test_samples_the_target_distribution(tiny_hetero_bundle, slrs1):
    b = Bundle.load(tiny_hetero_bundle)
    dec = SpeculativeDecoder(b, strategy="slrs1", draft_length=4, threads=1, options=REJECTION)
    pvals = check_lossless(dec, b, b.target.tokenizer.encode(PROMPT).ids, n=2000, seed=0)
    assert min(pvals.values()) > ALPHA, pvals


def _accept_everything(p, q, drafts, rng, a=1.0, terminal_nodraft=False, work=None):
    return len(drafts), sample(p[len(drafts)], rng)


def test_a_broken_verifier_fails_the_same_check(tiny_hetero_bundle, slrs1, monkeypatch):
    """Negative control (as tests/test_adaptive.py): the same check catches a verifier that accepts
    every psi_1 draft."""
    monkeypatch.setattr(rounds_module, "verify_sampled", _accept_everything)
    b = Bundle.load(tiny_hetero_bundle)
    dec = SpeculativeDecoder(b, strategy="slrs1", draft_length=4, threads=1, options=REJECTION)
    ids = b.target.tokenizer.encode(PROMPT).ids
    samples = sample_tokens(dec, ids, 2000, 0, SamplingParams(temperature=1.0))
    pvals = check_lossless(dec, b, ids, samples=samples)
    assert min(pvals.values()) < ALPHA, pvals
