"""Priors for the samplers: the target unigram prior and the sparse affinity M for exact RDK.

Target unigram prior (Taylor RDK's p, RDK paper Eq. 3; docs/papers.md):
    prior_j = (c_j + alpha) / (sum c + alpha V_t)        float32 over the target vocabulary, sums to 1.

Affinity M (Algorithm 1's row-stochastic prior; rows = kept drafter columns, columns = target ids),
top-k entries per row, estimated on teacher-forced positions n with target p_n and the drafter's
pruned-and-renormalised (TLI) distribution q'_n over the kept columns:
  cooc: M_i. ∝ E_n[q'_n,i p_n,.]    (what the target says where the drafter puts mass on i)
  cov:  Eq. 2, M_ij = softmax_j(Omega_{t(i) j} / tau_i) over the row's top-k, Omega the covariance of
        target probabilities across positions, t(i) the target id of column i. tau is relative:
        tau_i = tau * max_j Omega_{t(i) j}, so rows of frequent and rare tokens are equally sharp.
Memory stays bounded: each position contributes only its top-r q' and top-m p entries (r = m = 64 by
default; the captured mass is recorded), products are accumulated as sparse COO triples that are
merged periodically, and if the distinct pairs exceed a cap each row keeps its `row_cap` largest.
Rows that gathered nothing fall back to the identity (M_i = e_t(i): RDK is TLI there); rows of kept
columns without a target id stay empty (q' is zero there, so RDK never reads them).
"""
from __future__ import annotations

import numpy as np

from edgespec.calibrate.output import save_npz
from edgespec.calibrate.prefix_affinity import StructuralEstimator
from edgespec.calibrate.sparse_rows import by_row, row_pointers, top_k_per_row
from edgespec.errors import CalibrationError
from edgespec.runtime.samplers.rdk import Affinity, rdk_distribution, rdk_taylor_distribution

ESTIMATORS = ("cooc", "cov", "prefix", "first")   # prefix/first: tokenizer structure (prefix_affinity.py)


# --------------------------------------------------------------------------- unigram prior

def unigram_prior(target_counts: np.ndarray, alpha: float = 0.5) -> np.ndarray:
    """Add-alpha smoothed unigram distribution, float32, summing to 1 (within float32 rounding)."""
    if not alpha > 0:
        raise CalibrationError(f"prior smoothing alpha must be positive, got {alpha}")
    c = np.asarray(target_counts, dtype=np.float64)
    if c.ndim != 1 or c.size == 0 or np.any(c < 0):
        raise CalibrationError("target counts must be a non-negative 1-D array")
    p = (c + alpha) / (c.sum() + alpha * c.size)
    p32 = p.astype(np.float32)
    p32 /= p32.sum(dtype=np.float64)
    return p32


# --------------------------------------------------------------------------- sparse accumulation

class SparseAccumulator:
    """Sum of (row, col, value) triples over an [n_rows, n_cols] grid, with bounded memory."""

    def __init__(self, n_rows: int, n_cols: int, buffer: int = 2_000_000, cap: int = 12_000_000, row_cap: int = 128):
        self.n_rows, self.n_cols = int(n_rows), int(n_cols)
        self.buffer, self.cap, self.row_cap = buffer, cap, row_cap
        self.keys = np.zeros(0, dtype=np.int64)
        self.vals = np.zeros(0, dtype=np.float64)
        self._pending_k: list[np.ndarray] = []
        self._pending_v: list[np.ndarray] = []
        self._pending = 0
        self.pruned = False

    def add(self, rows: np.ndarray, cols: np.ndarray, vals: np.ndarray) -> None:
        keys = rows.astype(np.int64) * self.n_cols + cols.astype(np.int64)
        self._pending_k.append(keys.ravel())
        self._pending_v.append(np.asarray(vals, dtype=np.float64).ravel())
        self._pending += keys.size
        if self._pending >= self.buffer:
            self.compact()

    def compact(self) -> None:
        if not self._pending_k:
            return
        keys = np.concatenate([self.keys, *self._pending_k])
        vals = np.concatenate([self.vals, *self._pending_v])
        self._pending_k, self._pending_v, self._pending = [], [], 0
        uniq, inv = np.unique(keys, return_inverse=True)
        self.keys, self.vals = uniq, np.bincount(inv, weights=vals, minlength=uniq.size)
        if self.keys.size > self.cap:
            self._prune_rows(self.row_cap)

    def _prune_rows(self, keep: int) -> None:
        rows = self.keys // self.n_cols
        order = np.lexsort((-self.vals, rows))
        rows_sorted = rows[order]
        start = np.searchsorted(rows_sorted, rows_sorted, side="left")
        rank = np.arange(order.size) - start
        sel = np.sort(order[rank < keep])
        self.keys, self.vals = self.keys[sel], self.vals[sel]
        self.pruned = True

    def triples(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        self.compact()
        return self.keys // self.n_cols, self.keys % self.n_cols, self.vals


def top_entries(x: np.ndarray, m: int) -> tuple[np.ndarray, np.ndarray]:
    """Indices and values of the m largest entries of each row of x ([s, V] -> [s, m])."""
    m = min(m, x.shape[1])
    idx = np.argpartition(-x, m - 1, axis=1)[:, :m]
    return idx, np.take_along_axis(x, idx, axis=1)


def csr_top_k(rows: np.ndarray, cols: np.ndarray, vals: np.ndarray, n_rows: int, n_cols: int, k: int,
              transform=None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Keep the k largest `vals` per row, apply `transform(values, row_ids)` (default: divide by the row
    sum), and return CSR (data, indices, indptr) with columns ascending within a row."""
    keep = vals > 0 if transform is None else np.isfinite(vals)
    rows, cols, vals = rows[keep], cols[keep], vals[keep]
    sel = top_k_per_row(rows, cols, vals, k)
    rows, cols, vals = by_row(rows[sel], cols[sel], vals[sel])
    if transform is None:
        sums = np.bincount(rows, weights=vals, minlength=n_rows)
        vals = vals / sums[rows]
    else:
        vals = transform(vals, rows)
    return vals, cols, row_pointers(rows, n_rows)


def with_identity_fallback(data, indices, indptr, index_map: np.ndarray):
    """Fill empty rows whose column has a target id with the identity entry (RDK = TLI there)."""
    counts = np.diff(indptr)
    fill = (counts == 0) & (index_map >= 0)
    if not fill.any():
        return data, indices, indptr, 0
    new_counts = counts + fill
    new_indptr = np.concatenate([[0], np.cumsum(new_counts)]).astype(np.int64)
    new_data = np.empty(new_indptr[-1], dtype=np.float64)
    new_idx = np.empty(new_indptr[-1], dtype=np.int64)
    src_rows = np.repeat(np.arange(counts.size), counts)
    dst_pos = new_indptr[src_rows] + (np.arange(src_rows.size) - indptr[src_rows])
    new_data[dst_pos] = data
    new_idx[dst_pos] = indices
    new_data[new_indptr[:-1][fill]] = 1.0
    new_idx[new_indptr[:-1][fill]] = index_map[fill]
    return new_data, new_idx, new_indptr, int(fill.sum())


IDENTITY_GRID = (0.0, 0.5, 0.8, 0.9, 0.95, 0.98, 0.99, 1.0)


def mix_identity(csr: tuple, index_map: np.ndarray, w: float, k: int) -> tuple:
    """Shrink M toward the identity: row i -> (1 - w) M_i + w e_t(i), at most k entries per row (if t(i)
    is not among a row's entries, its smallest entry makes room). w = 1 is M = I, i.e. RDK = TLI;
    rows of columns without a target id are left as they are."""
    if not 0.0 <= w <= 1.0:
        raise CalibrationError(f"identity weight must be in [0, 1], got {w}")
    data, indices, indptr = (np.asarray(a) for a in csr)
    out_d, out_i, out_p = [], [], [0]
    for r in range(indptr.size - 1):
        cols, vals = indices[indptr[r]:indptr[r + 1]], data[indptr[r]:indptr[r + 1]].astype(np.float64)
        t = int(index_map[r])
        if t >= 0 and w > 0:
            if w >= 1.0:
                cols, vals = np.array([t]), np.array([1.0])
            else:
                if t not in cols and cols.size >= k:
                    drop = int(np.argmin(vals))
                    cols, vals = np.delete(cols, drop), np.delete(vals, drop)
                vals = (1 - w) * vals / vals.sum() if vals.size else vals
                if t in cols:
                    vals[cols == t] += w
                else:
                    cols, vals = np.append(cols, t), np.append(vals, w)
                order = np.argsort(cols)
                cols, vals = cols[order], vals[order] / vals.sum()
        out_d.append(vals)
        out_i.append(cols)
        out_p.append(out_p[-1] + cols.size)
    return (np.concatenate(out_d) if out_d else np.zeros(0), np.concatenate(out_i).astype(np.int64) if out_i
            else np.zeros(0, np.int64), np.asarray(out_p, dtype=np.int64))


# --------------------------------------------------------------------------- estimators

class CoocEstimator:
    """M_i. ∝ E[q'_i p_.]: outer products of the top-r q' and top-m p entries of each position."""
    name = "cooc"

    def __init__(self, index_map: np.ndarray, n_target: int, top_r: int = 64, top_m: int = 64, **acc_kw):
        self.index_map = np.asarray(index_map, dtype=np.int64)
        self.n_target = int(n_target)
        self.top_r, self.top_m = top_r, top_m
        self.acc = SparseAccumulator(self.index_map.size, n_target, **acc_kw)
        self.mass_q = self.mass_p = 0.0
        self.n = 0

    def add(self, p: np.ndarray, q_cols: np.ndarray) -> None:
        """p: [s, V_t] target probabilities; q_cols: [s, K] TLI distribution over kept columns."""
        qi, qv = top_entries(q_cols, self.top_r)
        pj, pv = top_entries(p, self.top_m)
        s, r, m = qi.shape[0], qi.shape[1], pj.shape[1]
        rows = np.broadcast_to(qi[:, :, None], (s, r, m))
        cols = np.broadcast_to(pj[:, None, :], (s, r, m))
        self.acc.add(rows, cols, qv[:, :, None] * pv[:, None, :])
        self.mass_q += float(qv.sum())
        self.mass_p += float(pv.sum())
        self.n += s

    def build(self, k: int, **_) -> tuple[tuple, dict]:
        rows, cols, vals = self.acc.triples()
        data, indices, indptr = csr_top_k(rows, cols, vals, self.index_map.size, self.n_target, k)
        data, indices, indptr, fallback = with_identity_fallback(data, indices, indptr, self.index_map)
        info = {"estimator": "cooc", "top_k": k, "top_r_q": self.top_r, "top_m_p": self.top_m,
                "captured_q_mass": self.mass_q / max(self.n, 1), "captured_p_mass": self.mass_p / max(self.n, 1),
                "identity_rows": fallback, "pruned_accumulator": self.acc.pruned}
        return (data, indices, indptr), info


class CovEstimator:
    """Eq. 2 on the covariance of target probabilities: second moments of the top-m p entries."""
    name = "cov"

    def __init__(self, index_map: np.ndarray, n_target: int, top_m: int = 64, **acc_kw):
        self.index_map = np.asarray(index_map, dtype=np.int64)
        self.n_target = int(n_target)
        self.top_m = top_m
        self.row_of_target = np.full(n_target, -1, dtype=np.int64)
        has = self.index_map >= 0
        self.row_of_target[self.index_map[has]] = np.flatnonzero(has)
        self.acc = SparseAccumulator(self.index_map.size, n_target, **acc_kw)
        self.mean = np.zeros(n_target, dtype=np.float64)
        self.mass_p = 0.0
        self.n = 0

    def add(self, p: np.ndarray, q_cols: np.ndarray | None = None) -> None:
        pj, pv = top_entries(p, self.top_m)
        self.mean += p.sum(axis=0, dtype=np.float64)
        rows = self.row_of_target[pj]                      # [s, m] kept column of each top entry, or -1
        s, m = pj.shape
        r = np.broadcast_to(rows[:, :, None], (s, m, m))
        c = np.broadcast_to(pj[:, None, :], (s, m, m))
        v = pv[:, :, None] * pv[:, None, :]
        ok = r >= 0
        self.acc.add(r[ok], c[ok], v[ok])
        self.mass_p += float(pv.sum())
        self.n += s

    def build(self, k: int, tau: float = 0.1, **_) -> tuple[tuple, dict]:
        if not tau > 0:
            raise CalibrationError(f"cov affinity temperature tau must be positive, got {tau}")
        if self.n == 0:
            raise CalibrationError("cov affinity: no calibration positions")
        rows, cols, s2 = self.acc.triples()
        mu = self.mean / self.n
        omega = s2 / self.n - mu[self.index_map[rows]] * mu[cols]

        def relative_softmax(vals, r):
            # a softmax over each ragged CSR row r, (v - max) / (tau |max|): not the dense
            # runtime.sampling.softmax (v / T - max), whose order of operations gives other floats
            row_max = np.full(self.index_map.size, -np.inf)
            np.maximum.at(row_max, r, vals)
            scale = tau * np.maximum(np.abs(row_max[r]), 1e-30)
            e = np.exp((vals - row_max[r]) / scale)
            return e / np.bincount(r, weights=e, minlength=self.index_map.size)[r]

        data, indices, indptr = csr_top_k(rows, cols, omega, self.index_map.size, self.n_target, k,
                                          transform=relative_softmax)
        data, indices, indptr, fallback = with_identity_fallback(data, indices, indptr, self.index_map)
        info = {"estimator": "cov", "top_k": k, "tau": tau, "tau_mode": "relative-to-row-max", "top_m_p": self.top_m,
                "captured_p_mass": self.mass_p / self.n, "identity_rows": fallback,
                "pruned_accumulator": self.acc.pruned}
        return (data, indices, indptr), info


def make_estimator(name: str, index_map: np.ndarray, n_target: int, tokenizers: tuple | None = None, **kw):
    """`tokenizers` = (target, drafter): needed by the structural estimators only."""
    if name in ("prefix", "first"):
        return StructuralEstimator(name, index_map, n_target, tokenizers)
    if name == "cooc":
        return CoocEstimator(index_map, n_target, **kw)
    if name == "cov":
        kw.pop("top_r", None)
        return CovEstimator(index_map, n_target, **kw)
    raise CalibrationError(f"unknown affinity estimator {name!r}; use one of {', '.join(ESTIMATORS)}")


def save_affinity(path, csr: tuple, shape: tuple[int, int]) -> None:
    """CSR .npz as docs/architecture.md: data float32, indices int32 (int64 past 2^31), indptr int64, shape int64[2]."""
    data, indices, indptr = csr
    idx_dtype = np.int32 if shape[1] < 2**31 else np.int64
    data32 = np.asarray(data, dtype=np.float32)
    # renormalise at the stored precision so each non-empty row sums to 1 in float32
    counts = np.diff(indptr)
    row_of = np.repeat(np.arange(counts.size), counts)
    sums = np.bincount(row_of, weights=data32.astype(np.float64), minlength=counts.size)
    if data32.size:
        data32 = (data32 / sums[row_of].astype(np.float32)).astype(np.float32)
    save_npz(path, data=data32, indices=np.asarray(indices, dtype=idx_dtype),
             indptr=np.asarray(indptr, dtype=np.int64), shape=np.asarray(shape, dtype=np.int64))


# --------------------------------------------------------------------------- held-out check

def acceptance_on(p_sparse: list[tuple[np.ndarray, np.ndarray]], q_cols: list[np.ndarray], index_map: np.ndarray,
                  n_target: int, csr: tuple | None = None, prior: np.ndarray | None = None) -> dict:
    """Mean sum_j min(p_j, d_j) over held-out positions for TLI (d = q'), RDK (d = M^T q') and
    Taylor RDK (Eq. 3 with the prior). p is stored as its top entries, so values are lower bounds."""
    has = index_map >= 0
    m = None
    if csr is not None:
        data, indices, indptr = csr
        m = Affinity.from_csr(data, indices, indptr, (index_map.size, n_target))
    tot = {"tli": 0.0, "rdk": 0.0, "rdk_taylor": 0.0}
    for (pi, pv), q in zip(p_sparse, q_cols):
        q_t = np.zeros(n_target)
        np.add.at(q_t, index_map[has], q[has])
        tot["tli"] += float(np.minimum(pv, q_t[pi]).sum())
        if m is not None:
            d = rdk_distribution(q.astype(np.float64), m)
            tot["rdk"] += float(np.minimum(pv, d[pi]).sum())
        if prior is not None:
            d = rdk_taylor_distribution(q_t, prior.astype(np.float64))
            tot["rdk_taylor"] += float(np.minimum(pv, d[pi]).sum())
    n = max(len(q_cols), 1)
    out = {"positions": len(q_cols), "acceptance_tli": tot["tli"] / n}
    if m is not None:
        out["acceptance_rdk"] = tot["rdk"] / n
    if prior is not None:
        out["acceptance_rdk_taylor"] = tot["rdk_taylor"] / n
    return out
