"""Redistributing Drafter Kernels (RDK paper; docs/papers.md).

Two out-of-vocabulary samplers that turn the TLI distribution q' over target ids into a draft
distribution that may put mass on target tokens the pruned drafter head cannot produce:

- Taylor RDK, Eq. 3, the first-order Taylor approximation, O(N) with N = |T|:
      theta = p . q',   p~_i = (N q'_i + beta * theta * p_i) / (N + p_i),   p_Taylor = p~ / sum(p~)
  p is the calibrated target unigram prior (BUNDLE/vocab/prior.npy). beta = 1 is the paper's formula;
  beta is our strength knob (theta -> beta * theta) so the profiler can sweep it. Its implementation
  is `RdkTaylor` (constants per prior; dense q') with `for_columns` -> `KeptTaylor` (q' on the kept
  target ids: what the decoder runs), used by the runtime, calibrate and the acceptance study
  (`rdk_taylor_distribution(q, p, beta)` is a one-off shorthand for it). tests/test_rdk.py checks it
  against the formula as printed.
- `rdk_distribution`: Algorithm 1, exact RDK p' = M^T q' with the calibrated sparse row-stochastic
  affinity M (rows: kept drafter columns, columns: target ids; BUNDLE/vocab/affinity.npz), O(nnz).
  With M = I (kept column r -> its target id) it is TLI, as the paper remarks.

Both outputs are proper distributions over target ids; the verify step (standard rejection sampling)
uses them as q, so decoding stays lossless whatever p or M are.

N = |T| is the target's logit width V_t (every target id is in T). NumPy only (no scipy.sparse in
the runtime): M^T q' is a row gather, a multiply and a bincount / scatter-add over the rows used.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from edgespec.errors import BundleError, GenerationError
from edgespec.runtime.samplers.sampling import SamplingParams
from edgespec.runtime.samplers.tli import KeptColumns, kept_columns, target_argmax, tli_column_probs, tli_distribution


# --------------------------------------------------------------------------- Taylor RDK (Eq. 3)

def rdk_taylor_distribution(q_tli: np.ndarray, prior: np.ndarray, beta: float = 1.0,
                            out: np.ndarray | None = None) -> np.ndarray:
    """Eq. 3 on a dense q' over the N target ids, for one-off use (the one implementation: RdkTaylor)."""
    return RdkTaylor(prior, beta)(q_tli, out=out)


class RdkTaylor:
    """Eq. 3 with the per-prior constants precomputed and preallocated buffers (no allocation per step).

    p~_i = q'_i * N/(N+p_i) + beta theta * p_i/(N+p_i): two constant vectors. q' is zero outside the
    K' target ids of the kept columns, so `for_columns(ids)` (what the runtime uses) computes the same
    p_Taylor with ONE dense pass over the N ids. `__call__` takes a dense q' (the literal form)."""

    def __init__(self, prior: np.ndarray, beta: float = 1.0, dtype=np.float64):
        prior = np.asarray(prior, dtype=dtype)
        if prior.ndim != 1 or not np.all(np.isfinite(prior)) or prior.min() < 0 or prior.sum() <= 0:
            raise BundleError("rdk-taylor: vocab/prior.npy is not a non-negative 1-D distribution")
        n = prior.shape[0]
        self.prior = prior / prior.sum()
        self.beta = float(beta)
        self.scale = n / (n + self.prior)                 # N / (N + p_i)
        self.shift = self.prior / (n + self.prior)        # p_i / (N + p_i)
        self.shift_sum = float(self.shift.sum())
        self._tmp = np.empty(n, dtype=dtype)

    def __call__(self, q_tli: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        if out is None:
            out = np.empty_like(self._tmp)
        theta = float(np.einsum("i,i->", self.prior, q_tli))
        np.multiply(q_tli, self.scale, out=out)
        np.multiply(self.shift, self.beta * theta, out=self._tmp)
        out += self._tmp
        out *= 1.0 / out.sum()
        return out

    def for_columns(self, target_ids: np.ndarray) -> "KeptTaylor":
        """Eq. 3 bound to a fixed kept set (the bundle's target ids): the per-id gathers done once."""
        return KeptTaylor(self, np.asarray(target_ids, dtype=np.intp))


class KeptTaylor:
    """p_Taylor for q' supported on fixed target ids (one per kept column; ids may repeat).

    Per step: theta and the normaliser from the K' kept entries, then ONE dense pass over N
    (out = c * shift) and a scatter of the K' kept ids' values. The gathers prior[ids] and
    scale[ids] are bundle constants, precomputed here. `argmax` is the temperature-0 draft without the
    dense pass: outside the kept ids p~ is c * shift_i, largest at the (precomputed) outside id of
    highest prior, so the argmax over N is decided by the K' kept values and that one id."""

    def __init__(self, taylor: RdkTaylor, target_ids: np.ndarray):
        self.taylor = taylor
        self.uniq, self.inverse = np.unique(target_ids, return_inverse=True)
        self.unique = self.uniq.size == target_ids.size
        self.ids = target_ids if self.unique else self.uniq             # where the kept terms land
        self.prior_cols = taylor.prior[target_ids]                      # p_i per kept column
        self.scale_cols = taylor.scale[target_ids]                      # N / (N + p_i) per kept column
        self.shift_ids = taylor.shift[self.ids]
        outside = np.ones(taylor.prior.shape[0], dtype=bool)
        outside[target_ids] = False
        rest = np.flatnonzero(outside)
        # np.argmax's tie rule: the lowest id among the largest shift values
        self.best_outside = int(rest[np.argmax(taylor.shift[rest])]) if rest.size else -1
        self._in_t = np.empty(target_ids.shape[0], dtype=taylor.prior.dtype)
        self._vals = np.empty(self.ids.shape[0], dtype=taylor.prior.dtype)

    def _terms(self, col_probs: np.ndarray) -> tuple[np.ndarray, float, float]:
        """(in-intersection terms N q'_i / (N + p_i) per id in self.ids, c = beta theta, z)."""
        t = self.taylor
        # einsum, not np.dot: np.dot calls OpenBLAS, whose threads must wake up after every ORT forward
        # (measured 4-6 ms a step with cold caches, against 0.1 ms, and they compete with ORT's threads)
        c = t.beta * float(np.einsum("i,i->", self.prior_cols, col_probs))
        in_t = np.multiply(col_probs, self.scale_cols, out=self._in_t)
        if not self.unique:
            in_t = np.bincount(self.inverse, weights=in_t, minlength=self.uniq.size)
        return in_t, c, float(in_t.sum()) + c * t.shift_sum

    def _kept_values(self, col_probs: np.ndarray) -> tuple[np.ndarray, float]:
        """(p_Taylor on self.ids, c / z): the kept ids' values, and the factor on shift elsewhere."""
        in_t, c, z = self._terms(col_probs)
        in_t *= 1.0 / z
        vals = np.multiply(self.shift_ids, c / z, out=self._vals)
        vals += in_t
        return vals, c / z

    def distribution(self, col_probs: np.ndarray, out: np.ndarray) -> np.ndarray:
        vals, k = self._kept_values(col_probs)
        np.multiply(self.taylor.shift, k, out=out)      # the one dense pass
        out[self.ids] = vals                            # a scatter over K' (no gather of out)
        return out

    def argmax(self, col_probs: np.ndarray) -> int:
        """argmax over N of `distribution` (the same values, so ties resolve the same way)."""
        vals, k = self._kept_values(col_probs)
        val = float(vals.max())
        tid = int(self.ids[vals == val].min())                 # np.argmax's tie rule: the lowest id
        if self.best_outside >= 0:
            out_val = float(self.taylor.shift[self.best_outside] * k)
            if out_val > val or (out_val == val and self.best_outside < tid):
                return self.best_outside
        return tid


# --------------------------------------------------------------------------- exact RDK (Algorithm 1)

@dataclass
class Affinity:
    """The sparse row-stochastic affinity M in CSR form (rows: kept columns, columns: target ids).

    Also held row-padded ([K, w] with w = the longest row, zero-weight padding) when that costs at
    most 4x the CSR size, as it is for calibrate's top-k rows: selecting rows is then a plain gather."""
    data: np.ndarray          # float64 [nnz]
    indices: np.ndarray       # intp [nnz]   target id of each entry
    indptr: np.ndarray        # int64 [K+1]
    shape: tuple[int, int]    # (K, V_t)
    padded_data: np.ndarray | None = None      # [K, w]
    padded_indices: np.ndarray | None = None   # [K, w]

    @classmethod
    def from_csr(cls, data, indices, indptr, shape, row_sum_tol: float = 1e-3) -> "Affinity":
        """Validate the CSR arrays (as stored in affinity.npz: the one check, for the bundle loader and
        the calibrator alike) and build the padded form."""
        data, indices, indptr, shape = (np.asarray(a) for a in (data, indices, indptr, shape))
        if not (shape.shape == (2,) and shape.dtype.kind in "iu" and (shape >= 0).all() and data.ndim == 1
                and data.dtype.kind == "f" and indices.dtype.kind in "iu" and indptr.dtype.kind in "iu"):
            raise BundleError("affinity M: inconsistent CSR arrays (data/indices/indptr/shape)")
        data = data.astype(np.float64, copy=False)
        indices = indices.astype(np.intp, copy=False)
        indptr = indptr.astype(np.int64, copy=False)
        k, v = int(shape[0]), int(shape[1])
        lengths = np.diff(indptr) if indptr.ndim == 1 and indptr.size == k + 1 else None
        if (lengths is None or indptr[0] != 0 or indptr[-1] != data.shape[0]
                or indices.shape != data.shape or np.any(lengths < 0)):
            raise BundleError("affinity M: inconsistent CSR arrays (data/indices/indptr/shape)")
        if data.size and (indices.min() < 0 or indices.max() >= v):
            raise BundleError(f"affinity M: column index out of range [0, {v})")
        if data.size and (not np.all(np.isfinite(data)) or data.min() < 0):
            raise BundleError("affinity M: negative or non-finite entries")
        rows = np.repeat(np.arange(k, dtype=np.intp), lengths)
        sums = np.bincount(rows, weights=data, minlength=k)
        if np.any(np.abs(sums[lengths > 0] - 1.0) > row_sum_tol):
            raise BundleError("affinity M: rows are not stochastic (row sums differ from 1)")
        m = cls(data=data, indices=indices, indptr=indptr, shape=(k, v))
        width = int(lengths.max()) if k else 0
        if k * width <= 4 * max(data.size, 1):
            slot = np.arange(data.size) - np.repeat(indptr[:-1], lengths)   # position within its row
            m.padded_data = np.zeros((k, width))
            m.padded_indices = np.zeros((k, width), dtype=np.intp)
            m.padded_data[rows, slot] = data
            m.padded_indices[rows, slot] = indices
        return m

    @classmethod
    def load(cls, path) -> "Affinity":
        """Read affinity.npz (data, indices, indptr, shape), never with pickle."""
        try:
            with np.load(path, allow_pickle=False) as z:
                return cls.from_csr(z["data"], z["indices"], z["indptr"], z["shape"])
        except (OSError, KeyError, ValueError) as e:
            raise BundleError(f"cannot read affinity M from {path}: {e}") from None

    @classmethod
    def identity(cls, index_map: np.ndarray, n_target: int) -> "Affinity":
        """M = I restricted to the kept columns (kept column r -> target id index_map[r]); rows of
        columns without a target id are empty. RDK with this M is TLI."""
        index_map = np.asarray(index_map)
        has = index_map >= 0
        indptr = np.concatenate([[0], np.cumsum(has)]).astype(np.int64)
        return cls.from_csr(np.ones(int(has.sum())), index_map[has], indptr, (index_map.size, n_target))


def rdk_distribution(q_kept: np.ndarray, m: Affinity, out: np.ndarray | None = None,
                     tol: float = 0.0) -> np.ndarray:
    """Algorithm 1, step 2: p' = M^T q' in O(nnz + V_t).

    q_kept: the TLI distribution q' over the K kept columns (zero where a column has no target id).
    tol = 0: every row with q'_r > 0 (exact). tol > 0: only the largest rows of q' that hold at least
    1 - tol of its mass (found by partial sorts of 64, 256, ... rows); p' then moves by at most 2 tol
    in L1 and the cost falls to O(K + rows kept x row width). Either way p' is what the draft is
    sampled from and verified against, so decoding stays lossless. Returns p' over the V_t target ids
    (in `out` when given), normalised (absorbs rounding, dropped rows and empty rows)."""
    k, v = m.shape
    if q_kept.shape[0] != k:
        raise BundleError(f"affinity M has {k} rows but the drafter head has {q_kept.shape[0]} columns")
    rows = np.flatnonzero(q_kept > 0.0) if tol <= 0.0 else _top_mass_rows(q_kept, 1.0 - tol)
    if m.padded_data is not None and rows.size == k:                # every row: no gather needed
        weights, cols = m.padded_data * q_kept[:, None], m.padded_indices
    elif m.padded_data is not None:
        weights = m.padded_data[rows] * q_kept[rows, None]        # M_rj q'_r for the kept rows
        cols = m.padded_indices[rows]
    else:
        starts, lengths = m.indptr[rows], m.indptr[rows + 1] - m.indptr[rows]
        first = np.cumsum(lengths) - lengths
        entries = np.repeat(starts - first, lengths) + np.arange(int(lengths.sum()))
        weights = m.data[entries] * np.repeat(q_kept[rows], lengths)
        cols = m.indices[entries]
    total = weights.sum()
    if total <= 0:
        raise BundleError("affinity M has no entries for any drafted column")
    weights *= 1.0 / total
    if weights.size > v // 4:                            # many entries: one bincount beats a scatter-add
        p = np.bincount(cols.ravel(), weights=weights.ravel(), minlength=v)
        if out is None:
            return p
        out[:] = p
        return out
    out = np.zeros(v) if out is None else out
    out.fill(0.0)
    np.add.at(out, cols.ravel(), weights.ravel())        # few entries: scatter-add into the zeroed row
    return out


def _top_mass_rows(q: np.ndarray, mass: float) -> np.ndarray:
    """Rows of q above a threshold, lowered 100x at a time from max(q)/100 until they hold >= mass.
    A superset of the fewest rows holding that mass, found with a few vectorised passes (no sort)."""
    thr = float(q.max()) * 1e-2
    while thr > 1e-300:
        rows = np.flatnonzero(q > thr)
        if q[rows].sum() >= mass:
            return rows
        thr *= 1e-2
    return np.flatnonzero(q > 0.0)


# --------------------------------------------------------------------------- strategies `rdk-taylor`, `rdk`
# The pieces strategies.py registers. Options, from the decoder's strategy options: rdk_beta
# (rdk-taylor strength, default 1 = Eq. 3 as printed) and
# rdk_tol (rdk's dropped-mass tolerance, default 1e-3; 0 = every row of M).

DEFAULT_TOL = 1e-3


@dataclass
class _RdkState:
    cols: KeptColumns
    taylor: "KeptTaylor | None" = None
    affinity: Affinity | None = None
    tol: float = DEFAULT_TOL
    q_kept: np.ndarray | None = None        # [K] buffer (rdk)
    identity: bool = False                  # M = I on the kept columns: rdk is TLI (rdk)
    out: np.ndarray | None = None           # [V_t] buffer (greedy drafts)


def check_taylor(bundle, options) -> None:
    options = options or {}
    if bundle.prior is None:
        raise GenerationError("strategy 'rdk-taylor' needs the target prior vocab/prior.npy, which this bundle "
                              "lacks: run `edgespec calibrate` and re-export with --vocab")
    beta = options.get("rdk_beta", 1.0)
    if not (np.isfinite(beta) and beta >= 0):
        raise GenerationError(f"rdk_beta must be a finite number >= 0, got {beta!r}")


def check_rdk(bundle, options) -> None:
    options = options or {}
    if bundle.affinity is None:
        raise GenerationError("strategy 'rdk' needs the affinity matrix M (vocab/affinity.npz), which this bundle "
                              "lacks: run `edgespec calibrate --affinity cooc` and re-export with --vocab "
                              "(or use 'rdk-taylor', which needs only the prior)")
    tol = options.get("rdk_tol", DEFAULT_TOL)
    if not (0.0 <= tol < 1.0):
        raise GenerationError(f"rdk_tol must be in [0, 1), got {tol!r}")


def prepare_taylor(bundle, options) -> _RdkState:
    options = options or {}
    cols = kept_columns(bundle, options)
    prior = np.asarray(bundle.prior, dtype=np.float64)
    if prior.shape != (cols.target_vocab,):
        raise BundleError(f"prior has {prior.shape[0]} entries but the target vocabulary has {cols.target_vocab}")
    taylor = RdkTaylor(prior, float(options.get("rdk_beta", 1.0))).for_columns(cols.target_ids)
    return _RdkState(cols, taylor=taylor, out=np.empty(cols.target_vocab))


def prepare_rdk(bundle, options) -> _RdkState:
    options = options or {}
    cols = kept_columns(bundle, options)
    m = bundle.affinity                 # checked when the bundle was loaded (Affinity.from_csr)
    if m.shape != (cols.index_map.shape[0], cols.target_vocab):
        raise BundleError(f"affinity M has shape {m.shape}, expected (kept columns, target vocabulary) = "
                          f"({cols.index_map.shape[0]}, {cols.target_vocab})")
    return _RdkState(cols, affinity=m, tol=float(options.get("rdk_tol", DEFAULT_TOL)),
                     q_kept=np.zeros(cols.index_map.shape[0]), out=np.empty(cols.target_vocab),
                     identity=_is_identity(m, cols))


def _is_identity(m: Affinity, cols) -> bool:
    """M is exactly `Affinity.identity` of the kept columns, what calibrate writes when its held-out
    shrink picks w = 1."""
    ident = Affinity.identity(cols.index_map, cols.target_vocab)
    return all(np.array_equal(a, b) for a, b in
               ((m.indptr, ident.indptr), (m.indices, ident.indices), (m.data, ident.data)))


def taylor_distribution(state: _RdkState, kept_logits, params, out):
    cols = state.cols
    return state.taylor.distribution(tli_column_probs(kept_logits, cols, params), out)


def rdk_strategy_distribution(state: _RdkState, kept_logits, params, out):
    if state.identity:          # Algorithm 1 with M = I is TLI (the paper's remark): skip the no-op M^T q'
        return tli_distribution(state.cols, kept_logits, params, out)
    state.q_kept[state.cols.valid_cols] = tli_column_probs(kept_logits, state.cols, params)
    return rdk_distribution(state.q_kept, state.affinity, out=out, tol=state.tol)


_T1 = SamplingParams(temperature=1.0)


def taylor_greedy(state: _RdkState, kept_logits) -> int:
    """Temperature 0: the argmax of the RDK distribution built at temperature 1."""
    return state.taylor.argmax(tli_column_probs(kept_logits, state.cols, _T1))


def rdk_greedy(state: _RdkState, kept_logits) -> int:
    if state.identity:          # argmax of p' = q' over target ids, without the dense row
        return target_argmax(tli_column_probs(kept_logits, state.cols, _T1), state.cols)
    return int(np.argmax(rdk_strategy_distribution(state, kept_logits, _T1, state.out)))

