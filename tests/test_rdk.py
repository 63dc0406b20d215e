"""RDK samplers on synthetic distributions: Eq. 3 transcription, M = I is TLI, M^T q' vs dense."""
import numpy as np
import pytest

from edgespec.errors import BundleError
from edgespec.runtime.rdk import Affinity, RdkTaylor, rdk_distribution, rdk_taylor_distribution


def _tli_and_prior(rng, n=50, n_kept=20):
    """A TLI distribution over n target ids supported on n_kept of them, and a target prior."""
    q = np.zeros(n)
    support = rng.choice(n, n_kept, replace=False)
    q[support] = rng.dirichlet(np.full(n_kept, 0.3))
    return q, rng.dirichlet(np.full(n, 0.5))


def _eq3_by_hand(q, p, beta):
    """Eq. 3 transcribed literally, one token at a time."""
    n = len(q)
    theta = sum(p[i] * q[i] for i in range(n))
    tilde = [(n * q[i] + beta * theta * p[i]) / (n + p[i]) for i in range(n)]
    s = sum(tilde)
    return np.array([t / s for t in tilde])


@pytest.mark.parametrize("beta", [1.0, 5.0, 1000.0])
def test_taylor_matches_eq3(beta):
    rng = np.random.default_rng(1)
    q, p = _tli_and_prior(rng)
    want = _eq3_by_hand(q, p, beta)
    np.testing.assert_allclose(rdk_taylor_distribution(q, p, beta), want, rtol=1e-12, atol=1e-15)
    out = np.empty_like(q)
    got = RdkTaylor(p, beta)(q, out=out)
    assert got is out
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-15)


def test_taylor_puts_mass_outside_the_intersection_growing_with_beta():
    rng = np.random.default_rng(2)
    q, p = _tli_and_prior(rng)
    oov = q == 0
    masses = [rdk_taylor_distribution(q, p, beta)[oov].sum() for beta in (1.0, 10.0, 100.0)]
    assert 0 < masses[0] < masses[1] < masses[2]


def test_rdk_with_identity_is_tli():
    rng = np.random.default_rng(3)
    n_target = 40
    index_map = rng.choice(n_target, 16, replace=False)
    index_map[[2, 9]] = -1                                   # kept columns without a target id
    q_kept = rng.dirichlet(np.ones(16))
    q_kept[index_map < 0] = 0.0
    q_kept /= q_kept.sum()
    tli = np.zeros(n_target)
    tli[index_map[index_map >= 0]] = q_kept[index_map >= 0]
    m = Affinity.identity(index_map, n_target)
    np.testing.assert_allclose(rdk_distribution(q_kept, m), tli, rtol=0, atol=1e-15)


def _random_affinity(rng, k, v, max_row):
    lengths = rng.integers(1, max_row + 1, k)
    indptr = np.concatenate([[0], np.cumsum(lengths)])
    indices = np.concatenate([rng.choice(v, n, replace=False) for n in lengths]).astype(np.int32)
    data = np.concatenate([rng.dirichlet(np.ones(n)) for n in lengths]).astype(np.float32)
    dense = np.zeros((k, v))
    for r in range(k):
        dense[r, indices[indptr[r]:indptr[r + 1]]] = data[indptr[r]:indptr[r + 1]]
    return Affinity.from_csr(data, indices, indptr, np.array([k, v])), dense


@pytest.mark.parametrize("padded", [True, False])
def test_rdk_equals_dense_mt_q(padded):
    rng = np.random.default_rng(4)
    m, dense = _random_affinity(rng, 30, 70, 6)
    assert m.padded_data is not None
    if not padded:
        m.padded_data = m.padded_indices = None               # the plain CSR path
    q = rng.dirichlet(np.full(30, 0.2))
    want = dense.T @ q
    np.testing.assert_allclose(rdk_distribution(q, m), want / want.sum(), rtol=1e-6, atol=1e-9)


def test_rdk_tolerance_bounds_the_l1_error():
    rng = np.random.default_rng(5)
    m, _ = _random_affinity(rng, 200, 300, 8)
    q = rng.dirichlet(np.full(200, 0.05))
    exact = rdk_distribution(q, m)
    for tol in (1e-6, 1e-3, 1e-1):
        approx = rdk_distribution(q, m, tol=tol)
        assert abs(approx.sum() - 1) < 1e-12
        assert np.abs(approx - exact).sum() <= 2 * tol + 1e-12


def test_affinity_validation():
    ok = dict(data=np.array([0.5, 0.5, 1.0]), indices=np.array([0, 2, 1]), indptr=np.array([0, 2, 3]), shape=(2, 3))
    Affinity.from_csr(**ok)
    with pytest.raises(BundleError, match="stochastic"):
        Affinity.from_csr(**{**ok, "data": np.array([0.5, 0.4, 1.0])})
    with pytest.raises(BundleError, match="out of range"):
        Affinity.from_csr(**{**ok, "indices": np.array([0, 3, 1])})
    with pytest.raises(BundleError, match="inconsistent"):
        Affinity.from_csr(**{**ok, "indptr": np.array([0, 2])})
    with pytest.raises(BundleError, match="columns"):
        rdk_distribution(np.ones(3) / 3, Affinity.from_csr(**ok))
