"""The drafting probability a* of randomised drafting (randomised-drafting paper, Lemma 4.4 and §4.3; docs/papers.md).

    a* = argmin_{a in [0,1]}  f(a),   f(a) = mean_n ||p_n - a q_n||_1 + a (2 lambda - 1)

over teacher-forced calibration positions n (p: target, q: the drafter's distribution over target ids),
with lambda = T_draft / T_target, the measured step-time ratio.

f is convex and piecewise linear: for a token with q > 0, |p - a q| = q |r - a| with r = p / q, so the
breakpoints are the ratios r and
    f'(a) = 2 W(r < a) - W + 2 lambda - 1,     W(.) = (1/N) sum of q over the tokens in (.)
f is minimised at the smallest a with W(r <= a) >= (W + 1 - 2 lambda) / 2: a weighted quantile of the
ratios (`solve_exact`). With every q_n summing to 1 (W = 1) the threshold is 1 - lambda; and a* < 1
exactly when sum_{p>q} q < lambda on average, Lemma 4.3's condition.

Streaming (`AStarAccumulator`): positions are folded into a histogram of the ratios on [0, 1] with
B bins holding sum q and sum q r = sum p per bin. Between two bin edges f is linear in each term, so
f is *exact* at every edge; a* is the best edge, within 1/B of the exact minimiser and within 2/B of
the optimal value (|f'| <= 2). Memory: 2 B float64 (B = 2^20: 16 MB), whatever the number of positions.
"""
from __future__ import annotations

import numpy as np

from edgespec.errors import CalibrationError

DEFAULT_BINS = 1 << 20


def _check_lambda(lam: float) -> float:
    lam = float(lam)
    if not np.isfinite(lam) or lam < 0:
        raise CalibrationError(f"lambda (drafter/target step-time ratio) must be a non-negative number, got {lam}")
    return lam


def objective(a: float | np.ndarray, p: np.ndarray, q: np.ndarray, lam: float) -> np.ndarray:
    """f(a) for rows of p and q ([N, V]); vectorised over an array of a (brute force, for tests)."""
    a = np.atleast_1d(np.asarray(a, dtype=np.float64))
    p = np.asarray(p, dtype=np.float64).reshape(-1, np.shape(p)[-1])
    q = np.asarray(q, dtype=np.float64).reshape(p.shape)
    vals = np.abs(p[None] - a[:, None, None] * q[None]).sum(axis=2).mean(axis=1)
    return vals + a * (2 * lam - 1)


def solve_exact(p: np.ndarray, q: np.ndarray, lam: float) -> tuple[float, float]:
    """(a*, f(a*)) exactly, from the breakpoints (weighted quantile of p/q with weights q/N)."""
    lam = _check_lambda(lam)
    p = np.asarray(p, dtype=np.float64).reshape(-1, np.shape(p)[-1])
    q = np.asarray(q, dtype=np.float64).reshape(p.shape)
    if p.size == 0:
        raise CalibrationError("a*: no calibration positions")
    n = p.shape[0]
    sup = q > 0
    r = p[sup] / q[sup]
    w = q[sup] / n
    order = np.argsort(r, kind="stable")
    r, w = r[order], w[order]
    threshold = (w.sum() + 1 - 2 * lam) / 2
    cum = np.cumsum(w)
    i = int(np.searchsorted(cum, threshold, side="left"))
    if threshold <= 0:
        a = 0.0
    elif i >= r.size:
        a = 1.0
    else:
        a = float(min(max(r[i], 0.0), 1.0))
    return a, float(objective(a, p, q, lam)[0])


class AStarAccumulator:
    """Streaming a*: fold (p, q) positions into ratio histograms; `solve(lam)` at the end."""

    def __init__(self, bins: int = DEFAULT_BINS):
        self.bins = int(bins)
        self.w = np.zeros(self.bins + 1, dtype=np.float64)    # sum q per bin; last bin: r >= 1
        self.wr = np.zeros(self.bins + 1, dtype=np.float64)   # sum p (= q r) per bin
        self.p_off = 0.0                                      # p mass where q = 0
        self.l1_vanilla = 0.0                                 # sum_n ||p_n - q_n||_1 (a = 1), exact
        self.n = 0

    def add(self, p_sup: np.ndarray, q: np.ndarray, p_total: np.ndarray | None = None) -> None:
        """p_sup, q: [s, K] target and drafter probabilities on the drafter's support (target ids of
        the kept columns); p_total: [s] total target mass per row (default 1)."""
        p_sup = np.asarray(p_sup, dtype=np.float64)
        q = np.asarray(q, dtype=np.float64)
        s = p_sup.shape[0]
        p_total = np.ones(s) if p_total is None else np.asarray(p_total, dtype=np.float64)
        off = p_total - p_sup.sum(axis=1)
        self.p_off += float(off.sum())
        self.l1_vanilla += float(np.abs(p_sup - q).sum() + off.sum())
        m = q > 0
        qs, ps = q[m], p_sup[m]
        b = np.minimum(np.floor(ps / qs * self.bins), self.bins).astype(np.int64)
        self.w += np.bincount(b, weights=qs, minlength=self.bins + 1)
        self.wr += np.bincount(b, weights=ps, minlength=self.bins + 1)
        self.n += s

    def edge_objective(self, lam: float) -> tuple[np.ndarray, np.ndarray]:
        """(edges a = 0, 1/B, ..., 1; exact f at each edge)."""
        if self.n == 0:
            raise CalibrationError("a*: no calibration positions")
        edges = np.arange(self.bins + 1, dtype=np.float64) / self.bins
        w_lt = np.concatenate([[0.0], np.cumsum(self.w[:-1])])        # sum q with r < edge
        p_lt = np.concatenate([[0.0], np.cumsum(self.wr[:-1])])
        w_all, p_all = self.w.sum(), self.wr.sum()
        l1 = edges * w_lt - p_lt + (p_all - p_lt) - edges * (w_all - w_lt) + self.p_off
        return edges, l1 / self.n + edges * (2 * lam - 1)

    def solve(self, lam: float) -> dict:
        lam = _check_lambda(lam)
        edges, f = self.edge_objective(lam)
        i = int(np.argmin(f))                   # first minimum: the smallest optimal a on the grid
        a = float(edges[i])
        tv_a = float(f[i] - a * (2 * lam - 1))          # mean ||p - a q||_1 at a*
        tv_1 = self.l1_vanilla / self.n                 # mean ||p - q||_1 (vanilla SD)
        alpha_sd = 1 - tv_1 / 2
        alpha_rd = (1 + a - tv_a) / (2 * a) if a > 0 else 1.0
        # expected TPS of randomised drafting relative to vanilla SD (paper's App. A.1, k = 1)
        tps_sd = (1 + alpha_sd) / (1 + lam)
        tps_rd = (a * alpha_rd * 2 + a * (1 - alpha_rd)) / (1 + lam) + (1 - a)
        return {"a_star": a, "lambda": lam, "objective": float(f[i]), "objective_at_1": float(f[-1]),
                "objective_at_0": float(f[0]), "acceptance_sd": alpha_sd, "acceptance_rd": alpha_rd,
                "tps_ratio_rd_over_sd_k1": tps_rd / tps_sd, "positions": self.n, "bins": self.bins,
                "lemma_4_3_sum_q_where_p_gt_q": float(self._sum_q_p_gt_q()), "solver": "histogram-edges"}

    def _sum_q_p_gt_q(self) -> float:
        """Mean over positions of sum_{p > q} q: the bins above r = 1 (Lemma 4.3's left-hand side)."""
        return self.w[-1] / self.n
