"""Sampling parameters, logits -> probabilities, and seeded draws. NumPy only.

`probabilities(logits, params)` applies, in this order (the order transformers uses): temperature,
top-k, softmax, top-p (nucleus), min-p (tokens below min_p times the top probability dropped) and
renormalisation. It works row-wise on
[..., V] logits and returns float64 rows summing to 1 (float64 keeps rejection sampling exact to
~1e-16 on 150k-token vocabularies; the cost is one [rows, V] array per verify step).

temperature 0 means greedy: callers use `np.argmax` on the logits and never build probabilities.
Rejection sampling draws from one `np.random.Generator` per generation (inverse CDF here); seeded
generations use the race of coupled.py instead, which makes the text a function of the seed alone.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from edgespec.errors import GenerationError


MIN_TEMPERATURE = 1e-4        # any lower is greedy in effect, and logits / t overflow float32 below ~1e-36


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None

    def __post_init__(self):
        t = self.temperature
        if t is None or not np.isfinite(t) or t < 0:
            raise GenerationError(f"temperature must be a finite number >= 0, got {t!r}")
        if 0 < t < MIN_TEMPERATURE:
            raise GenerationError(f"temperature must be 0 (greedy) or >= {MIN_TEMPERATURE:g}, got {t!r} "
                                  "(logits / t would overflow float32)")
        if self.top_k is not None and (int(self.top_k) != self.top_k or self.top_k < 1):
            raise GenerationError(f"top_k must be an integer >= 1 or None, got {self.top_k!r}")
        if self.top_p is not None and not (0.0 < self.top_p <= 1.0):
            raise GenerationError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if self.min_p is not None and not (0.0 <= self.min_p <= 1.0):
            raise GenerationError(f"min_p must be in [0, 1], got {self.min_p!r}")

    @property
    def truncates(self) -> bool:
        """Whether top-p or min-p cut the softmaxed row (truncate_probabilities has work to do)."""
        return (self.top_p is not None and self.top_p < 1.0) or bool(self.min_p)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def softmax(logits: np.ndarray, temperature: float = 1.0, dtype=np.float32,
            out: np.ndarray | None = None) -> np.ndarray:
    """softmax(logits / temperature) over the last axis; -inf logits get probability 0. The one softmax
    of edgespec (runtime, calibrate, the study, export's quality check).

    Dtype rule: every step (the division by the temperature, the max shift, exp, the normalisation)
    runs in `dtype`: float32 by default, the models' logit precision (calibrate's teacher-forced
    passes); float64 where small masses matter (sampling probabilities, the acceptance study's pruned
    drafters, export's quality check). With `out` (which may be `logits` itself: an in-place softmax)
    the computation runs in out's dtype instead and `dtype` is ignored. Temperature 1 skips the
    division (x / 1 == x exactly). The order is fixed: x / T, x - max(x), exp, x / sum(x).
    (The decoder's draft step, tli.tli_column_probs, fuses the same steps with top-k between them
    and a float64 normalisation; calibrate/priors.py's covariance estimator softmaxes ragged CSR rows.)"""
    if out is None:
        z = np.array(logits, dtype=dtype)                   # always a copy: the caller's logits stay
    else:
        z = out
        if z is not logits:
            np.copyto(z, logits)
    if temperature != 1.0:
        z /= z.dtype.type(temperature)
    z -= z.max(axis=-1, keepdims=True)
    np.exp(z, out=z)
    z /= z.sum(axis=-1, keepdims=True)
    return z


def top_k_mask(row: np.ndarray, k: int) -> None:
    """Set all but the k largest entries of a 1-D row to -inf (ties at the boundary are kept)."""
    if k >= row.shape[0]:
        return
    kth = np.partition(row, -k)[-k]
    row[row < kth] = -np.inf


def top_p_mask(row: np.ndarray, top_p: float) -> None:
    """Given a 1-D row of *probabilities*, zero all tokens outside the smallest set whose mass reaches
    top_p (the token that crosses the threshold is kept; ties with it are kept too). Sorts only the
    support when it is small (after top-k), else looks at the top 64, 256, ... candidates before a
    full sort, since nucleus sets are usually small. (argpartition on a row full of equal zeros is
    slow, hence the support path.)"""
    n = row.shape[0]
    if np.count_nonzero(row) <= 4096:                  # small support (after top-k): sort it all
        support = np.flatnonzero(row)
        order = support[np.argsort(row[support])[::-1]]
        csum = np.cumsum(row[order])
    else:
        m = 64
        while True:
            m = min(m, n)
            cand = np.argpartition(row, n - m)[n - m:] if m < n else np.arange(n)
            order = cand[np.argsort(row[cand])[::-1]]
            csum = np.cumsum(row[order])
            if csum[-1] >= top_p or m == n:
                break
            m *= 4
    cut = min(int(np.searchsorted(csum, top_p)) + 1, order.size)       # keep order[:cut]
    threshold = row[order[cut - 1]]
    row[row < threshold] = 0.0


def truncate_probabilities(row: np.ndarray, params: SamplingParams) -> None:
    """Top-p, then min-p, on one 1-D row of probabilities, renormalised in place (the one place both
    cuts are applied: the target's rows and the drafters' alike)."""
    if params.top_p is not None and params.top_p < 1.0:
        top_p_mask(row, params.top_p)
    if params.min_p:
        row[row < params.min_p * row.max()] = 0.0
    row /= row.sum()


def _top_k_row(logits_row: np.ndarray, params: SamplingParams, out_row: np.ndarray) -> None:
    """Top-k path for one row: only the k best logits (ties with the k-th included) are touched, so
    the O(V) work is one selection, one comparison and one fill."""
    k = int(params.top_k)
    kth = np.partition(logits_row, -k)[-k]          # (np.partition is ~3x faster than argpartition here)
    idx = np.flatnonzero(logits_row >= kth)
    vals = logits_row[idx].astype(np.float64)
    vals /= params.temperature
    softmax(vals, out=vals)
    if params.truncates:
        truncate_probabilities(vals, params)
    out_row.fill(0.0)
    out_row[idx] = vals


def probabilities(logits: np.ndarray, params: SamplingParams, out: np.ndarray | None = None) -> np.ndarray:
    """Rows of logits [..., V] -> float64 probabilities after temperature, top-k, top-p and min-p.

    `params.temperature` must be > 0 here (greedy never builds probabilities)."""
    if params.greedy:
        raise ValueError("greedy sampling has no probabilities; use argmax")
    if out is None:
        out = np.empty(logits.shape, dtype=np.float64)
    v = logits.shape[-1]
    if params.top_k is not None and params.top_k < v:
        for lg, r in zip(logits.reshape(-1, v), out.reshape(-1, v)):
            _top_k_row(lg, params, r)
        return out
    np.divide(logits, params.temperature, out=out, casting="unsafe")
    rows = out.reshape(-1, v)
    softmax(rows, out=rows)
    if params.truncates:
        for r in rows:
            truncate_probabilities(r, params)
    return out


_BLOCK = 512


def _inverse_cdf(probs: np.ndarray, x: float, cdf: np.ndarray | None = None) -> int | None:
    """Index i with cumsum(probs)[i-1] <= x < cumsum(probs)[i], never a zero-probability one (None if
    rounding pushed x past every positive entry)."""
    csum = np.cumsum(probs, out=cdf)
    i = min(int(np.searchsorted(csum, x, side="right")), probs.shape[0] - 1)
    while i >= 0 and probs[i] <= 0.0:    # x on the top edge through rounding: step back to a real token
        i -= 1
    return i if i >= 0 else None


def sample(probs: np.ndarray, rng: np.random.Generator, cdf: np.ndarray | None = None) -> int:
    """One draw from a 1-D probability vector (unnormalised is fine) by inverse CDF, with one uniform.

    Large vectors are searched in two levels: block sums (a fast reduction) locate a block of 512,
    then a cumsum inside it; the same inverse CDF as a full cumsum, ~9x cheaper at 150k entries.
    `cdf`: an optional float64 work buffer of the same length (no allocation per draw)."""
    n = probs.shape[0]
    u = rng.random()
    nb = n // _BLOCK
    if nb < 4:
        total = probs.sum()
        i = _inverse_cdf(probs, u * total, None if cdf is None else cdf[:n])
        return int(i)
    sums = cdf[:nb + 1] if cdf is not None else np.empty(nb + 1)
    np.sum(probs[:nb * _BLOCK].reshape(nb, _BLOCK), axis=1, out=sums[:nb])
    sums[nb] = probs[nb * _BLOCK:].sum()
    np.cumsum(sums, out=sums)
    x = u * sums[-1]
    b = min(int(np.searchsorted(sums, x, side="right")), nb)
    while b > 0 and sums[b] <= sums[b - 1]:          # an empty block (rounding): step back
        b -= 1
    lo = b * _BLOCK
    i = _inverse_cdf(probs[lo:lo + _BLOCK], x - (sums[b - 1] if b else 0.0))
    if i is None:                                   # rounding at a block edge: its last positive token
        i = int(np.flatnonzero(probs[lo:lo + _BLOCK])[-1])
    return lo + i


def make_rng(seed: int | None) -> np.random.Generator:
    return np.random.default_rng(seed)
