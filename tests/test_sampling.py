"""Sampling: temperature/top-k/top-p against direct references, inverse-CDF draws, validation,
and the token-level strategies (TLI restriction/renormalisation, registry)."""
import numpy as np
import pytest

from edgespec.errors import GenerationError
from edgespec.runtime.round import strategies as R
from edgespec.runtime.samplers import tli as S
from edgespec.runtime.samplers.sampling import SamplingParams, probabilities, sample
from test_verify import ScriptedRNG  # tests/ is on sys.path (conftest.py)


def _ref(logits, t, k=None, top_p=None, min_p=None):
    x = logits.astype(np.float64) / t
    if k is not None and k < x.size:
        x[x < np.sort(x)[-k]] = -np.inf
    p = np.exp(x - x.max())
    p /= p.sum()
    if top_p is not None:
        order = np.argsort(-p, kind="stable")
        cut = int(np.searchsorted(np.cumsum(p[order]), top_p)) + 1
        keep = np.zeros_like(p, dtype=bool)
        keep[order[:cut]] = True
        p = np.where(keep, p, 0.0)
        p /= p.sum()
    if min_p:                                              # after top-p, against the top token's probability
        p = np.where(p >= min_p * p.max(), p, 0.0)
        p /= p.sum()
    return p


@pytest.mark.parametrize("v", [10, 3000])
@pytest.mark.parametrize("t,k,top_p,min_p", [(1.0, None, None, None), (0.7, None, None, None), (1.3, 5, None, None),
                                            (1.0, None, 0.9, None), (0.8, 50, 0.5, None), (1.0, None, 0.999, None),
                                            (1.0, None, None, 0.05), (0.9, 40, 0.95, 0.1), (1.2, None, 0.9, 0.3)])
def test_probabilities_match_reference(v, t, k, top_p, min_p):
    rng = np.random.default_rng(v)
    logits = (rng.standard_normal((3, v)) * 3).astype(np.float32)
    got = probabilities(logits, SamplingParams(temperature=t, top_k=k, top_p=top_p, min_p=min_p))
    for row, ref_logits in zip(got, logits):
        np.testing.assert_allclose(row, _ref(ref_logits, t, k, top_p, min_p), rtol=1e-6, atol=1e-12)
        if min_p and v > 100:
            assert (row > 0).sum() < (_ref(ref_logits, t, k, top_p) > 0).sum()     # min-p cut something
        assert row.sum() == pytest.approx(1.0, abs=1e-12)


def test_sample_is_the_inverse_cdf():
    p = np.array([0.2, 0.0, 0.5, 0.3])
    assert sample(p, ScriptedRNG([0.0])) == 0
    assert sample(p, ScriptedRNG([0.19])) == 0
    assert sample(p, ScriptedRNG([0.2])) == 2          # the zero-probability token is never drawn
    assert sample(p, ScriptedRNG([0.71])) == 3
    assert sample(p, ScriptedRNG([np.nextafter(1.0, 0)])) == 3
    assert sample(np.array([0.3, 0.7, 0.0]), ScriptedRNG([np.nextafter(1.0, 0)])) == 1


def test_seeded_draws_are_reproducible():
    p = np.full(50, 1 / 50)
    a = [sample(p, np.random.default_rng(5)) for _ in range(3)]
    r = np.random.default_rng(5)
    b = [sample(p, r) for _ in range(20)]
    r = np.random.default_rng(5)
    assert b == [sample(p, r) for _ in range(20)]
    assert len(set(a)) == 1


@pytest.mark.parametrize("kwargs", [dict(temperature=-0.1), dict(temperature=float("nan")), dict(top_p=0.0),
                                    dict(top_p=1.5), dict(top_k=0), dict(top_k=2.5),
                                    dict(min_p=-0.1), dict(min_p=1.5)])
def test_bad_sampling_parameters(kwargs):
    with pytest.raises(GenerationError):
        SamplingParams(**{"temperature": 1.0, **kwargs})


class _FakeBundle:
    """The two attributes kept_columns reads, for a synthetic vocabulary (no ORT involved)."""

    def __init__(self, index_map, v):
        self.index_map = np.asarray(index_map, dtype=np.int64)
        self.target = type("T", (), {"vocab_size": v})()


def test_tli_restricts_renormalises_and_merges_duplicates():
    # kept columns 0..4 -> target ids (col 2 has none; cols 3 and 4 decode to the same target id 6)
    state = S.kept_columns(_FakeBundle([1, 4, -1, 6, 6], 8))
    logits = np.array([0.0, 1.0, 5.0, 0.5, -1.0], dtype=np.float32)
    out = np.empty(8)
    q = S.tli_distribution(state, logits, SamplingParams(temperature=1.0), out)
    e = np.exp(logits[[0, 1, 3, 4]].astype(np.float64))
    e /= e.sum()
    expect = np.zeros(8)
    expect[[1, 4]] = e[:2]
    expect[6] = e[2] + e[3]
    np.testing.assert_allclose(q, expect, rtol=1e-6, atol=1e-15)      # softmax in float32 ...
    assert abs(q.sum() - 1.0) < 1e-12                                  # ... normalised in float64
    assert S.tli_greedy(state, logits) == 4          # column 2 (no target id) is never drafted


def test_tli_with_top_k_and_temperature():
    state = S.kept_columns(_FakeBundle([0, 1, 2, 3], 5))
    logits = np.array([1.0, 3.0, 2.0, 0.0], dtype=np.float32)
    q = S.tli_distribution(state, logits, SamplingParams(temperature=0.5, top_k=2), np.empty(5))
    e = np.exp(np.array([3.0, 2.0]) / 0.5)
    np.testing.assert_allclose(q, [0, e[0] / e.sum(), e[1] / e.sum(), 0, 0], rtol=1e-6, atol=1e-15)


def test_strategy_registry():
    with pytest.raises(GenerationError, match="unknown strategy"):
        R.get_strategy("nope")
    assert R.get_strategy("sd").distribution is R.get_strategy("tli").distribution   # one code path
    custom = R.register(R.Strategy("test-uniform",  # uniform over the intersection
                                   distribution=lambda st, lg, pr, out: S.scatter_to_target(
                                       np.full(st.valid_cols.size, 1 / st.valid_cols.size), st, out)))
    try:
        state = custom.prepare(_FakeBundle([2, 0], 3), {})
        assert custom.greedy(state, np.zeros(2, dtype=np.float32)) in (0, 2)    # default greedy = argmax of q
    finally:
        R.STRATEGIES.pop("test-uniform")


def test_two_level_sampler_is_the_full_inverse_cdf():
    """Vectors longer than 4 blocks use block sums + a cumsum inside one block: the same index as a
    full inverse CDF, never a zero-probability token, also at block boundaries."""
    rng = np.random.default_rng(0)
    v = 5000
    p = rng.random(v) ** 8
    p[512:1024] = 0.0                      # an empty block
    p[rng.integers(0, v, 800)] = 0.0
    p /= p.sum()
    csum = np.cumsum(p)
    us = list(rng.random(300)) + [csum[b * 512 - 1] for b in range(1, 9)] + [0.0, np.nextafter(1.0, 0)]
    work = np.empty(v)
    for u in us:
        got = sample(p, ScriptedRNG([u]), work)
        assert p[got] > 0
        x = u * csum[-1]
        ref = int(np.searchsorted(csum, x, side="right"))
        near_edge = min(abs(x - csum[max(ref - 1, 0)]), abs(x - csum[min(ref, v - 1)])) < 1e-12
        if ref < v and not near_edge:      # on an edge, float rounding may pick either neighbour
            assert got == ref, (u, got, ref)
