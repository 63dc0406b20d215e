"""The study's `union` baseline (heterogeneous-vocabularies paper, Alg. 1) against TLI (Theorem 4.1), and
the SLRS upper bound against SLRS with one token of lookahead (profiler/study/samplers.py)."""
from __future__ import annotations

import numpy as np
import pytest

from edgespec.calibrate.prefix_affinity import TokenStructure, first_token_csr
from edgespec.profiler.study.samplers import attach_samplers, attach_slrs_bound, level_alphas, make_level

import tinymodels


def _softmax(x):
    z = np.exp(x - x.max(axis=-1, keepdims=True))
    return z / z.sum(axis=-1, keepdims=True)


def _random_case(seed, v_d=60, v_t=50, s=16, unmapped=12):
    rng = np.random.default_rng(seed)
    d2t = rng.permutation(v_t)[:v_d] if v_d <= v_t else rng.integers(0, v_t, v_d)
    d2t = np.asarray(d2t, dtype=np.int64)
    d2t[rng.choice(v_d, unmapped, replace=False)] = -1
    p = _softmax(rng.normal(0, 2, (s, v_t)))
    q = _softmax(rng.normal(0, 2, (s, v_d)))
    return rng, d2t, p, q


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("pct", [10, 50, 100])
def test_union_is_alg1_and_never_beats_tli(seed, pct):
    rng, d2t, p, q = _random_case(seed, v_d=40, v_t=50)
    level = make_level(pct, rng.permutation(d2t.size), d2t)
    a = level_alphas(p, q, level, tol=0.0)
    for i in range(p.shape[0]):                      # Alg. 1 by hand: the pruned drafter's law, not renormalised on T
        q_s = np.zeros(d2t.size)
        q_s[level.cols] = q[i, level.cols] / q[i, level.cols].sum()
        union = np.zeros(p.shape[1])
        np.add.at(union, d2t[d2t >= 0], q_s[d2t >= 0])
        assert a[("union", None)][i] == pytest.approx(np.minimum(p[i], union).sum(), abs=1e-12)
    assert np.all(a[("union", None)] <= a[("tli", None)] + 1e-12)        # Theorem 4.1
    if level.valid_cols.size < level.cols.size:                           # kept mass outside T: strictly lower
        assert np.any(a[("union", None)] < a[("tli", None)] - 1e-3)
    else:
        np.testing.assert_allclose(a[("union", None)], a[("tli", None)], atol=1e-12)
    if pct == 100:
        np.testing.assert_allclose(a[("union", None)], a[("masked", None)], atol=1e-12)


def test_union_equals_tli_when_every_kept_token_is_in_the_target_vocabulary():
    rng, d2t, p, q = _random_case(7, v_d=40, v_t=50, unmapped=0)
    level = make_level(30, rng.permutation(d2t.size), d2t)
    a = level_alphas(p, q, level, tol=0.0)
    np.testing.assert_allclose(a[("union", None)], a[("tli", None)], atol=1e-12)


def test_union_equals_tli_when_the_target_ignores_the_drafted_tokens():
    rng, d2t, p, q = _random_case(8, v_d=20, v_t=50)
    level = make_level(100, np.arange(d2t.size), d2t)
    off = np.setdiff1d(np.arange(p.shape[1]), d2t[d2t >= 0])
    p = np.zeros_like(p)
    p[:, off] = _softmax(rng.normal(0, 1, (p.shape[0], off.size)))         # no mass on the drafter's tokens
    a = level_alphas(p, q, level, tol=0.0)
    np.testing.assert_allclose(a[("union", None)], 0.0, atol=1e-15)
    np.testing.assert_allclose(a[("tli", None)], 0.0, atol=1e-15)


def test_slrs_upper_bound_holds_over_slrs_with_one_token_of_lookahead():
    toks = tinymodels.tiny_tokenizers()
    target, drafter = toks["bytelevel"], toks["spiece"]
    n_t, n_d = 608, 512
    s = TokenStructure(target, drafter, n_t, n_d)
    from edgespec.runtime.bundle.vocab import build_maps

    d2t, _ = build_maps(target, drafter, n_t, n_d)
    rng = np.random.default_rng(3)
    p = _softmax(rng.normal(0, 3, (24, n_t)))
    q = _softmax(rng.normal(0, 3, (24, n_d)))
    for pct in (20, 100):
        level = make_level(pct, rng.permutation(n_d), d2t)
        attach_samplers(level, {}, {"first": first_token_csr(s)}, n_t)
        attach_slrs_bound(level, s, n_t)
        a = level_alphas(p, q, level, tol=0.0)
        assert np.all(a[("rdk", "first")] <= a[("slrs-bound", None)] + 1e-12)
        assert np.all(a[("slrs-bound", None)] <= 1.0)
