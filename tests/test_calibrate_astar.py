"""a* of randomised drafting (Lemma 4.4): exact solver and streaming solver against a brute-force grid."""
from __future__ import annotations

import numpy as np
import pytest

from edgespec.calibrate.astar import AStarAccumulator, objective, solve_exact
from edgespec.errors import CalibrationError


def _pairs(rng, n=40, v=12, sharp=2.0):
    p = rng.dirichlet(np.full(v, 1 / sharp), size=n)
    q = rng.dirichlet(np.full(v, 1 / sharp), size=n)
    return p, q


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("lam", [0.0, 0.1, 0.3, 0.5, 0.8, 1.0, 1.7])
def test_exact_solver_matches_brute_force_grid(seed, lam):
    rng = np.random.default_rng(seed)
    p, q = _pairs(rng)
    a, f = solve_exact(p, q, lam)
    grid = np.linspace(0, 1, 20001)
    fg = objective(grid, p, q, lam)
    assert 0.0 <= a <= 1.0
    assert f == pytest.approx(objective(a, p, q, lam)[0])
    assert f <= fg.min() + 1e-12                      # nothing on the grid beats the exact optimum
    assert abs(grid[np.argmin(fg)] - a) < 1e-3 or fg.min() - f < 1e-9   # same minimiser unless the minimum is flat


def test_lemma_4_3_condition_decides_whether_a_is_below_one():
    rng = np.random.default_rng(7)
    p, q = _pairs(rng, n=60)
    s = np.mean([q[i][p[i] > q[i]].sum() for i in range(p.shape[0])])   # mean sum_{p>q} q
    assert solve_exact(p, q, s + 0.05)[0] < 1.0
    assert solve_exact(p, q, max(s - 0.05, 0.0))[0] == pytest.approx(1.0)


def test_lambda_at_least_one_never_drafts_and_zero_always_drafts():
    rng = np.random.default_rng(1)
    p, q = _pairs(rng)
    assert solve_exact(p, q, 1.0)[0] == 0.0
    f0 = solve_exact(p, q, 0.0)[1]
    assert f0 == pytest.approx(objective(1.0, p, q, 0.0)[0])


@pytest.mark.parametrize("seed", range(4))
def test_streaming_solver_matches_exact(seed):
    rng = np.random.default_rng(100 + seed)
    p, q = _pairs(rng, n=80, v=30)
    acc = AStarAccumulator(bins=1 << 14)
    for i in range(0, 80, 7):                         # positions arrive in uneven batches
        acc.add(p[i:i + 7], q[i:i + 7])
    for lam in (0.05, 0.3, 0.6):
        a_ex, f_ex = solve_exact(p, q, lam)
        res = acc.solve(lam)
        assert abs(res["a_star"] - a_ex) <= 1.0 / acc.bins + 1e-12
        assert res["objective"] == pytest.approx(objective(res["a_star"], p, q, lam)[0], abs=1e-9)  # exact at edges
        assert res["objective"] - f_ex <= 2.0 / acc.bins
        assert res["objective_at_1"] == pytest.approx(objective(1.0, p, q, lam)[0])
        assert res["acceptance_sd"] == pytest.approx(np.minimum(p, q).sum(axis=1).mean())


def test_streaming_with_q_on_a_subset_of_p():
    """The drafter's support is the kept target ids; p mass outside it enters as a constant."""
    rng = np.random.default_rng(3)
    p, q = _pairs(rng, n=50, v=20)
    q[:, 15:] = 0
    q /= q.sum(axis=1, keepdims=True)
    acc = AStarAccumulator(bins=1 << 12)
    acc.add(p[:, :15], q[:, :15], p.sum(axis=1))
    a_ex, _ = solve_exact(p, q, 0.3)
    assert abs(acc.solve(0.3)["a_star"] - a_ex) <= 1.0 / acc.bins + 1e-12


def test_bad_lambda_and_no_positions():
    acc = AStarAccumulator(bins=16)
    with pytest.raises(CalibrationError, match="no calibration positions"):
        acc.solve(0.3)
    rng = np.random.default_rng(0)
    p, q = _pairs(rng, n=3)
    with pytest.raises(CalibrationError, match="lambda"):
        solve_exact(p, q, -0.1)
    acc.add(p, q)
    with pytest.raises(CalibrationError, match="lambda"):
        acc.solve(float("nan"))
