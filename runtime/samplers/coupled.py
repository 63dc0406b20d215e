"""Coupled sampling: with a seed, the token at output index i is a fixed function of the target's own
distribution there and noise keyed by (seed, i), so a seeded generation's tokens do not depend on what
was drafted.

The law is the exponential race (the Gumbel-max trick in another form): with E_x ~ Exp(1) independent
per token x, argmax_x p(x) / E_x is distributed exactly as p. The E row of index i comes from its own
counter-based stream, SFC64 seeded by SeedSequence([seed, i]), so it is the same whichever round,
draft length, plan mode or thread count reaches that index. A draft is accepted exactly when it equals
the token the target's race picks there (`verify_coupled`); at the first mismatch that token is
committed instead. Each committed token is therefore the one `ar` with the same seed samples: exact,
not only in distribution. A drafter that races its own q over the same E proposes the target's token
whenever the two races agree, which they do with probability close to sum min(p, q) when p and q are
close (docs/results.md, 2026-12-02, gives the measured acceptance against rejection sampling's).
"""
from __future__ import annotations

import numpy as np

_TINY = np.finfo(np.float64).tiny      # E = 0 (u = 0, probability 2**-53 a token): a race won outright
_KEEP = 64                              # E rows remembered: a round's drafts and verify rows reuse them


class RaceNoise:
    """The E rows of one seeded generation, by output index (made on first use, the latest kept)."""

    def __init__(self, seed: int):
        self.seed = int(seed)
        self._rows: dict[int, np.ndarray] = {}

    def at(self, index: int, size: int) -> np.ndarray:
        """E_x ~ Exp(1) for x < size at output index `index`: -log(1 - u), u from the index's own stream."""
        row = self._rows.get(index)
        if row is None or row.shape[0] != size:
            u = np.random.Generator(np.random.SFC64(np.random.SeedSequence([self.seed, int(index)]))).random(size)
            np.subtract(1.0, u, out=u)               # (0, 1]
            np.log(u, out=u)
            np.negative(u, out=u)
            row = np.maximum(u, _TINY, out=u)
            if len(self._rows) >= _KEEP:
                del self._rows[min(self._rows)]
            self._rows[index] = row
        return row


def race_pick(probs: np.ndarray, noise_row: np.ndarray) -> int:
    """argmax_x probs(x) / E_x over one row (unnormalised is fine: the race ignores scale); zero-probability
    tokens never win."""
    return int(np.argmax(probs / noise_row[:probs.shape[0]]))


def verify_coupled(p: np.ndarray, drafts: np.ndarray, noise: RaceNoise, first_index: int) -> tuple[int, int]:
    """(number of accepted drafts, the token committed after them): row j of p (the target after the
    drafts before j) picks its token with the E row of output index first_index + j; drafts are accepted
    while they equal those picks."""
    n = int(len(drafts))
    for j in range(n + 1):
        t = race_pick(p[j], noise.at(first_index + j, p.shape[1]))
        if j == n or t != int(drafts[j]):
            return j, t
    raise AssertionError("unreachable")
