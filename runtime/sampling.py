"""Sampling parameters, logits -> probabilities, and seeded draws. NumPy only.

`probabilities(logits, params)` applies, in this order (the order transformers and llama.cpp use):
temperature, top-k, top-p (nucleus), then a softmax over what is left. It works row-wise on
[..., V] logits and returns float64 rows summing to 1 (float64 keeps rejection sampling exact to
~1e-16 on 150k-token vocabularies; the cost is one [rows, V] array per verify step).

temperature 0 means greedy: callers use `np.argmax` on the logits and never build probabilities.
All randomness comes from one `np.random.Generator` per generation, so seeded runs are reproducible.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from edgespec.errors import GenerationError


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None

    def __post_init__(self):
        t = self.temperature
        if t is None or not np.isfinite(t) or t < 0:
            raise GenerationError(f"temperature must be a finite number >= 0, got {t!r}")
        if self.top_k is not None and (int(self.top_k) != self.top_k or self.top_k < 1):
            raise GenerationError(f"top_k must be an integer >= 1 or None, got {self.top_k!r}")
        if self.top_p is not None and not (0.0 < self.top_p <= 1.0):
            raise GenerationError(f"top_p must be in (0, 1], got {self.top_p!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def softmax_rows(x: np.ndarray) -> np.ndarray:
    """In-place softmax over the last axis of a float64 array (-inf entries get probability 0)."""
    x -= x.max(axis=-1, keepdims=True)
    np.exp(x, out=x)
    x /= x.sum(axis=-1, keepdims=True)
    return x


def top_k_mask(row: np.ndarray, k: int) -> None:
    """Set all but the k largest entries of a 1-D row to -inf (ties at the boundary are kept)."""
    if k >= row.shape[0]:
        return
    kth = np.partition(row, -k)[-k]
    row[row < kth] = -np.inf


def top_p_mask(row: np.ndarray, top_p: float) -> None:
    """Given a 1-D row of *probabilities*, zero all tokens outside the smallest set whose mass reaches
    top_p (the token that crosses the threshold is kept). Looks at the top 64, 256, ... candidates
    before falling back to a full sort, since nucleus sets are usually small."""
    n = row.shape[0]
    m = 64
    while True:
        m = min(m, n)
        cand = np.argpartition(row, n - m)[n - m:] if m < n else np.arange(n)
        order = cand[np.argsort(row[cand])[::-1]]
        csum = np.cumsum(row[order])
        if csum[-1] >= top_p or m == n:
            cut = int(np.searchsorted(csum, top_p)) + 1       # keep order[:cut]
            cut = min(cut, m)
            threshold = row[order[cut - 1]]
            # keep everything >= the last kept probability (ties kept, like top-k)
            row[row < threshold] = 0.0
            return
        m *= 4


def probabilities(logits: np.ndarray, params: SamplingParams, out: np.ndarray | None = None) -> np.ndarray:
    """Rows of logits [..., V] -> float64 probabilities after temperature, top-k and top-p.

    `params.temperature` must be > 0 here (greedy never builds probabilities)."""
    if params.greedy:
        raise ValueError("greedy sampling has no probabilities; use argmax")
    if out is None:
        out = np.empty(logits.shape, dtype=np.float64)
    np.divide(logits, params.temperature, out=out, casting="unsafe")
    rows = out.reshape(-1, out.shape[-1])
    if params.top_k is not None:
        for r in rows:
            top_k_mask(r, int(params.top_k))
    softmax_rows(rows)
    if params.top_p is not None and params.top_p < 1.0:
        for r in rows:
            top_p_mask(r, params.top_p)
        rows /= rows.sum(axis=-1, keepdims=True)
    return out


def sample(probs: np.ndarray, rng: np.random.Generator) -> int:
    """One draw from a 1-D probability vector (inverse CDF; exact up to float rounding)."""
    csum = np.cumsum(probs)
    u = rng.random() * csum[-1]
    i = int(np.searchsorted(csum, u, side="right"))
    n = probs.shape[0]
    if i >= n:  # u landed on the very top edge through rounding
        i = n - 1
    while probs[i] <= 0.0:   # never return a zero-probability token (rounding at a flat CDF step)
        i -= 1
    return i


def make_rng(seed: int | None) -> np.random.Generator:
    return np.random.default_rng(seed)
