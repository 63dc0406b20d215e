"""`draft_length="auto"`: choose gamma in {0..gamma_max} before each round to maximise expected
tokens per second, from estimates measured in this process (nothing hard-coded):

    E[tokens | gamma] = 1 + sum_{j<=gamma} prod_{i<=j} alpha_i        (alpha_i: acceptance at draft position i)
    time(gamma)       = gamma * c_draft + t_verify(gamma + 1)
    gamma*            = argmax E / time;   gamma = 0 is plain decoding (`ar`)

alpha_i is a decayed count ratio shrunk toward the pooled acceptance of all positions; c_draft and
t_verify(k) are exponential moving averages of measured forwards; t_verify is then a weighted line
through the measured k (verify time grows about linearly with k), so an unmeasured k gets a guess and
one noisy sample cannot decide alone. Every 16th speculative round drafts one more than the best
guess, which keeps the estimates of longer drafts fresh. When gamma = 0 wins, the governor stops
drafting and re-probes with gamma = 1 after `probe_every` rounds, doubling the wait (up to 64) each
time the probe loses again: a cooldown like onnxruntime-genai's.

Lossless: gamma is a function of past rounds only (their acceptance and timings), never of the draws
the current round's verification uses, so every round still emits each token from the target's
conditional (and greedy output equals `ar`'s).
"""
from __future__ import annotations

import numpy as np

DECAY = 0.95           # weight of the past per round (~20-round memory)
EMA = 0.2              # weight of a new timing sample
PROBE_FIRST, PROBE_MAX = 8, 64
PROBE_UP = 16          # every 16th speculative round drafts one more than the best guess
POOL_WEIGHT = 4.0      # pseudo-observations of the pooled acceptance rate per draft position


class Governor:
    def __init__(self, gamma_max: int):
        self.gamma_max = int(gamma_max)
        self.reached = np.zeros(gamma_max)         # decayed counts per draft position
        self.accepted = np.zeros(gamma_max)
        self.verify_ms = np.full(gamma_max + 2, np.nan)   # index k = tokens fed
        self.draft_ms = np.nan
        self.samples = np.zeros(gamma_max + 2)           # timing samples per k
        self.probe_every = PROBE_FIRST
        self.rounds_at_zero = 0
        self.chosen: list[int] = []

    def choose(self, limit: int) -> int:
        """gamma for the next round, at most `limit` (tokens left, drafter context room)."""
        limit = min(limit, self.gamma_max)
        if limit <= 0:
            return 0
        if np.isnan(self.draft_ms) or np.isnan(self.verify_ms[1]):
            gamma = limit                  # measure a full round and one plain step first
            if np.isnan(self.verify_ms[1]) and not np.isnan(self.draft_ms):
                gamma = 0
        else:
            gamma = int(np.argmax(self.rates(limit)))
            if gamma == 0:
                self.rounds_at_zero += 1
                if self.rounds_at_zero >= self.probe_every:
                    gamma, self.rounds_at_zero = 1, 0
                    self.probe_every = min(self.probe_every * 2, PROBE_MAX)
            else:
                self.rounds_at_zero, self.probe_every = 0, PROBE_FIRST
                if len(self.chosen) % PROBE_UP == PROBE_UP - 1 and gamma < limit:
                    gamma += 1             # now and then one longer draft keeps its estimates fresh
        self.chosen.append(gamma)
        return gamma

    def rates(self, limit: int) -> np.ndarray:
        """Expected tokens per ms for gamma = 0..limit."""
        # per-position acceptance, shrunk toward the pooled rate (positions rarely reached borrow it, so a
        # bad first round cannot pin deep positions at a pessimistic prior)
        pooled = (self.accepted.sum() + 1.0) / (self.reached.sum() + 2.0)
        alpha = (self.accepted[:limit] + POOL_WEIGHT * pooled) / (self.reached[:limit] + POOL_WEIGHT)
        expected = 1.0 + np.concatenate([[0.0], np.cumsum(np.cumprod(alpha))])
        cost = np.arange(limit + 1) * self.draft_ms + self.verify_cost(limit + 1)
        return expected / cost

    def verify_cost(self, k_max: int) -> np.ndarray:
        """t_verify(k) for k = 1..k_max: a weighted least-squares line through the measured k (weights:
        samples, capped), so one noisy sample of a rarely chosen k cannot decide alone."""
        known = np.flatnonzero(self.samples > 0)
        if known.size == 1:
            return np.full(k_max, self.verify_ms[known[0]])
        w = np.minimum(self.samples[known], 20.0)
        slope, intercept = np.polyfit(known, self.verify_ms[known], 1, w=np.sqrt(w))
        return intercept + max(slope, 0.0) * np.arange(1, k_max + 1)

    def update(self, drafted: int, accepted: int, verify_ms: float, draft_ms: list[float]) -> None:
        """Book one round: positions 1..drafted were reached up to the first rejection."""
        self.reached *= DECAY
        self.accepted *= DECAY
        reached = min(drafted, accepted + 1)
        self.reached[:reached] += 1.0
        self.accepted[:accepted] += 1.0
        k = drafted + 1
        if k < self.verify_ms.size:
            old = self.verify_ms[k]
            self.verify_ms[k] = verify_ms if np.isnan(old) else (1 - EMA) * old + EMA * verify_ms
            self.samples[k] += 1
        for ms in draft_ms:
            self.draft_ms = ms if np.isnan(self.draft_ms) else (1 - EMA) * self.draft_ms + EMA * ms
