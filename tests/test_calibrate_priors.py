"""Unigram prior smoothing and the affinity M estimators (edgespec.calibrate.priors)."""
from __future__ import annotations

import numpy as np
import pytest

from edgespec.calibrate import priors as pr
from edgespec.errors import CalibrationError


def _rows_of(csr, n_rows):
    data, indices, indptr = csr
    return [(indices[indptr[i]:indptr[i + 1]], data[indptr[i]:indptr[i + 1]]) for i in range(n_rows)]


def test_unigram_prior_add_alpha():
    c = np.array([3, 0, 1, 0], dtype=np.int64)
    p = pr.unigram_prior(c, alpha=1.0)
    assert p.dtype == np.float32
    np.testing.assert_allclose(p, np.array([4, 1, 2, 1]) / 8, rtol=1e-6)
    assert abs(float(p.sum(dtype=np.float64)) - 1.0) < 1e-6
    big = pr.unigram_prior(np.random.default_rng(0).integers(0, 1000, 151_936), alpha=0.5)
    assert abs(float(big.sum(dtype=np.float64)) - 1.0) < 1e-5 and big.min() > 0


@pytest.mark.parametrize("alpha", [0.0, -1.0])
def test_unigram_prior_rejects_bad_alpha(alpha):
    with pytest.raises(CalibrationError, match="alpha"):
        pr.unigram_prior(np.ones(4), alpha)


def _synthetic(rng, s=60, v=24, k=10):
    logits = rng.normal(0, 2.5, size=(s, v))
    p = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
    kept_targets = np.sort(rng.choice(v, size=k, replace=False))
    index_map = kept_targets.copy()
    index_map[3] = -1                                # a kept column without a target id
    ql = logits[:, kept_targets] + rng.normal(0, 1.0, size=(s, k))
    q = np.exp(ql) / np.exp(ql).sum(1, keepdims=True)
    q[:, index_map < 0] = 0
    q /= q.sum(1, keepdims=True)
    return p.astype(np.float32), q.astype(np.float32), index_map


def test_cooc_matches_dense_expectation_and_rows_are_stochastic():
    rng = np.random.default_rng(0)
    p, q, index_map = _synthetic(rng)
    est = pr.make_estimator("cooc", index_map, p.shape[1], top_r=64, top_m=64)   # >= dims: exact
    for i in range(0, p.shape[0], 7):
        est.add(p[i:i + 7], q[i:i + 7])
    topk = 5
    csr, info = est.build(topk)
    dense = (q.astype(np.float64).T @ p.astype(np.float64)) / p.shape[0]         # E[q'_i p_j]
    for i, (cols, vals) in enumerate(_rows_of(csr, index_map.size)):
        if index_map[i] < 0:
            assert cols.size == 0                                                 # never read by RDK
            continue
        assert cols.size == topk and np.all(np.diff(cols) > 0)
        assert vals.sum() == pytest.approx(1.0)
        want = np.argsort(-dense[i], kind="stable")[:topk]
        assert set(cols.tolist()) == set(want.tolist())
        np.testing.assert_allclose(vals, dense[i, cols] / dense[i, cols].sum(), rtol=1e-6)
    assert info["estimator"] == "cooc" and info["identity_rows"] == 0


def test_cov_matches_eq2_on_dense_covariance():
    rng = np.random.default_rng(1)
    p, q, index_map = _synthetic(rng)
    v = p.shape[1]
    est = pr.make_estimator("cov", index_map, v, top_m=64)
    est.add(p[:30], q[:30])
    est.add(p[30:], q[30:])
    topk, tau = 6, 0.2
    csr, info = est.build(topk, tau=tau)
    pd = p.astype(np.float64)
    omega = (pd.T @ pd) / pd.shape[0] - np.outer(pd.mean(0), pd.mean(0))
    for i, (cols, vals) in enumerate(_rows_of(csr, index_map.size)):
        if index_map[i] < 0:
            assert cols.size == 0
            continue
        row = omega[index_map[i]]
        top = np.argsort(-row, kind="stable")[:topk]
        assert set(cols.tolist()) == set(top.tolist())
        scale = tau * abs(row[top].max())
        e = np.exp((row[cols] - row[top].max()) / scale)
        np.testing.assert_allclose(vals, e / e.sum(), rtol=1e-6)
        assert vals.sum() == pytest.approx(1.0)
    assert info["tau"] == tau and info["tau_mode"] == "relative-to-row-max"


def test_rows_without_data_fall_back_to_identity():
    index_map = np.array([5, 7, -1, 2])
    est = pr.make_estimator("cooc", index_map, 10, top_r=1, top_m=1)
    p = np.zeros((1, 10), dtype=np.float32)
    p[0, 7] = 1.0
    q = np.array([[0.0, 1.0, 0.0, 0.0]], dtype=np.float32)
    est.add(p, q)
    (d, idx, ptr), info = est.build(4)
    rows = _rows_of((d, idx, ptr), 4)
    assert rows[0][0].tolist() == [5] and rows[0][1].tolist() == [1.0]     # identity
    assert rows[1][0].tolist() == [7]                                      # learned
    assert rows[2][0].size == 0
    assert rows[3][0].tolist() == [2]
    assert info["identity_rows"] == 2


def test_sparse_accumulator_sums_and_prunes_rows():
    acc = pr.SparseAccumulator(3, 100, buffer=10, cap=20, row_cap=4)
    rng = np.random.default_rng(2)
    rows = rng.integers(0, 3, 500)
    cols = rng.integers(0, 100, 500)
    vals = rng.random(500)
    for i in range(0, 500, 25):
        acc.add(rows[i:i + 25], cols[i:i + 25], vals[i:i + 25])
    r, c, v = acc.triples()
    assert acc.pruned
    assert np.bincount(r, minlength=3).max() <= 4 + 25      # bounded per row (plus one unmerged batch)
    acc2 = pr.SparseAccumulator(3, 100)                     # no pruning: exact sums
    acc2.add(rows, cols, vals)
    r2, c2, v2 = acc2.triples()
    dense = np.zeros((3, 100))
    np.add.at(dense, (rows, cols), vals)
    np.testing.assert_allclose(dense[r2, c2], v2)
    assert np.count_nonzero(dense) == r2.size


def test_saved_affinity_loads_in_the_runtime(tmp_path):
    from edgespec.runtime.samplers.rdk import Affinity, rdk_distribution

    rng = np.random.default_rng(3)
    p, q, index_map = _synthetic(rng)
    est = pr.make_estimator("cooc", index_map, p.shape[1])
    est.add(p, q)
    csr, _ = est.build(4)
    path = tmp_path / "affinity.npz"
    pr.save_affinity(path, csr, (index_map.size, p.shape[1]))
    m = Affinity.load(path)
    with np.load(path, allow_pickle=False) as z:
        assert z["data"].dtype == np.float32 and z["indptr"].dtype == np.int64 and z["shape"].tolist() == [10, 24]
        sums = np.add.reduceat(z["data"].astype(np.float64), z["indptr"][:-1])[np.diff(z["indptr"]) > 0]
        np.testing.assert_allclose(sums, 1.0, atol=1e-6)
        assert np.diff(z["indptr"]).max() <= 4
    d = rdk_distribution(q[0].astype(np.float64), m)
    assert d.sum() == pytest.approx(1.0)


def test_unknown_estimator_and_bad_tau():
    with pytest.raises(CalibrationError, match="unknown affinity"):
        pr.make_estimator("pmi", np.arange(3), 5)
    est = pr.make_estimator("cov", np.arange(3), 5)
    est.add(np.full((1, 5), 0.2, dtype=np.float32))
    with pytest.raises(CalibrationError, match="tau"):
        est.build(2, tau=0.0)


def test_identity_shrinkage_keeps_rows_stochastic_and_sparse():
    index_map = np.array([3, 5, -1, 7])
    data = np.array([0.6, 0.4, 0.5, 0.3, 0.2, 1.0, 0.7, 0.3])
    indices = np.array([3, 4, 0, 1, 2, 9, 1, 2])
    indptr = np.array([0, 2, 5, 6, 8])
    csr = (data, indices, indptr)
    same = pr.mix_identity(csr, index_map, 0.0, 3)
    for a, b in zip(same, csr):
        np.testing.assert_allclose(a, b)
    ident = _rows_of(pr.mix_identity(csr, index_map, 1.0, 3), 4)
    assert [r[0].tolist() for r in ident] == [[3], [5], [9], [7]]
    rows = _rows_of(pr.mix_identity(csr, index_map, 0.9, 3), 4)
    for i, (cols, vals) in enumerate(rows):
        assert vals.sum() == pytest.approx(1.0) and cols.size <= 3 and np.all(np.diff(cols) > 0)
        if index_map[i] >= 0:
            assert vals[cols == index_map[i]][0] >= 0.9
    assert rows[0][0].tolist() == [3, 4] and rows[0][1].tolist() == pytest.approx([0.96, 0.04])
    assert rows[1][0].tolist() == [0, 1, 5]           # the smallest entry (col 2) made room for t(1) = 5
    assert rows[2][0].tolist() == [9]                  # no target id: untouched
    with pytest.raises(CalibrationError, match="identity weight"):
        pr.mix_identity(csr, index_map, 1.5, 3)
