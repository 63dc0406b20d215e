"""`draft_length="auto"`: choose gamma in {0..gamma_max} before each round to maximise expected
tokens per second, from estimates measured in this process (nothing hard-coded):

    E[tokens | gamma] = 1 + sum_{j<=gamma} prod_{i<=j} alpha_i     (alpha_i: acceptance at draft position i)
    E[tokens | 0]     = 1 + g     (g: the share of plain steps whose lookup guess was kept, rounds.plain_step)
    gamma*            = argmax_gamma E[tokens | gamma] / round_ms(gamma);   gamma = 0 is plain decoding

A plain step guesses when the guess pays: always where the target pads the step anyway (the guess is
free); otherwise while the kept share of guesses is at least the measured extra cost of a 2-token step,
guess_ms / plain_ms - 1 (re-probed every PROBE_UP plain steps when it is not, and a plain step without a
guess measured every PROBE_UP guesses until one is).

round_ms(n) is the measured wall time of whole rounds that drafted n tokens (drafter forwards, the
verify forward, sampling and bookkeeping: everything a round costs on this machine), an exponential
moving average once n has 3 samples, else a weighted least-squares line through the measured n (time
grows about linearly with n), so an unmeasured n gets a guess and one noisy sample cannot decide
alone. alpha_i is a decayed count ratio shrunk toward the pooled acceptance of all positions.

Each choice moves at most one step from the last (a hill climb on the model's rate), starting at 1.
When gamma = 0 wins, the governor stops drafting and re-probes with gamma = 1 after 8 rounds,
doubling the wait (up to 64) each time the probe loses again: a cooldown like onnxruntime-genai's.
Every 16th speculative round drafts one more than the best guess, to keep longer drafts measured.

Lossless: gamma is a function of past rounds only (their acceptance and timings), never of the draws
the current round's verification uses, so every round still emits each token from the target's
conditional (and greedy output equals `ar`'s).
"""
from __future__ import annotations

import numpy as np

DECAY = 0.95           # weight of the past per round (~20-round memory)
EMA = 0.2              # weight of a new timing sample
PROBE_FIRST, PROBE_MAX = 8, 64
PROBE_UP = 16
POOL_WEIGHT = 4.0      # pseudo-observations of the pooled acceptance rate per draft position
TRUSTED = 3            # samples after which a round length's own average replaces the line


class Governor:
    def __init__(self, gamma_max: int):
        self.gamma_max = int(gamma_max)
        self.reached = np.zeros(gamma_max)         # decayed counts per draft position
        self.accepted = np.zeros(gamma_max)
        self.round_ms = np.full(gamma_max + 1, np.nan)   # index n = tokens drafted
        self.samples = np.zeros(gamma_max + 1)
        self.probe_every = PROBE_FIRST
        self.rounds_at_zero = 0
        self.speculative_rounds = 0
        self.current = 1
        self.plain_steps = 0.0                      # decayed counts over plain steps (gamma = 0)
        self.guesses = 0.0                          # ... that carried a lookup guess
        self.guesses_kept = 0.0
        self.step_ms = np.full(2, np.nan)           # EMA ms of a plain step without / with a guess
        self.unguessed = 0                          # plain steps since the last guess
        self.guessed_run = 0                        # guesses since the last plain step without one

    def choose(self, limit: int) -> int:
        """gamma for the next round, at most `limit` (tokens left, drafter context room). Moves by at
        most one from the last choice (a hill climb on the model's rate), so one noisy round cannot
        send gamma across the range, and the neighbours it compares are the ones measured most."""
        limit = min(limit, self.gamma_max)
        if limit <= 0:
            return 0
        measured = np.flatnonzero(self.samples > 0)
        if measured.size < 2:                     # measure a 1-token draft and a plain step first
            return 0 if measured.size and measured[0] > 0 else 1
        hi = min(self.current + 1, limit)
        lo = min(max(self.current - 1, 0), hi)
        rates = self.rates(hi)
        gamma = lo + int(np.argmax(rates[lo:hi + 1]))
        if gamma == 0:
            self.rounds_at_zero += 1
            if self.rounds_at_zero >= self.probe_every:
                gamma, self.rounds_at_zero = 1, 0
                self.probe_every = min(self.probe_every * 2, PROBE_MAX)
        else:
            self.rounds_at_zero, self.probe_every = 0, PROBE_FIRST
            self.speculative_rounds += 1
            if self.speculative_rounds % PROBE_UP == 0 and gamma < limit:
                gamma += 1
        self.current = gamma
        return gamma

    def rates(self, limit: int) -> np.ndarray:
        """Expected tokens per ms for gamma = 0..limit."""
        pooled = (self.accepted.sum() + 1.0) / (self.reached.sum() + 2.0)
        alpha = (self.accepted[:limit] + POOL_WEIGHT * pooled) / (self.reached[:limit] + POOL_WEIGHT)
        guess = self.guesses_kept / (self.plain_steps + 1.0)
        expected = 1.0 + np.concatenate([[guess], np.cumsum(np.cumprod(alpha))])
        return expected / self.cost(limit)

    def cost(self, limit: int) -> np.ndarray:
        """round_ms for n = 0..limit drafted tokens."""
        known = np.flatnonzero(self.samples > 0)
        w = np.sqrt(np.minimum(self.samples[known], 20.0))
        slope, intercept = np.polyfit(known, self.round_ms[known], 1, w=w)
        n = np.arange(limit + 1)
        line = np.maximum(intercept + max(slope, 0.0) * n, 1e-3)
        own = self.samples[:limit + 1] >= TRUSTED
        return np.where(own, self.round_ms[:limit + 1], line)

    def guess_pays(self) -> bool:
        """Whether the next plain step should carry a lookup guess (module docstring)."""
        plain_ms, guess_ms = self.step_ms
        if np.isnan(plain_ms):                  # no plain step measured yet: one now and then
            return self.guessed_run < PROBE_UP
        if self.guesses < TRUSTED or np.isnan(guess_ms) or self.unguessed >= PROBE_UP:
            return True
        return self.guesses_kept / self.guesses >= guess_ms / plain_ms - 1.0

    def update(self, drafted: int, accepted: int, round_ms: float | None, guess_kept: int | None = None) -> None:
        """Book one round: positions 1..drafted were reached up to the first rejection. round_ms=None:
        a round that is not typical of its length (the drafter's prefill or catch-up); timing not used.
        guess_kept: a plain step's lookup guess, 1 kept or 0 (None: it carried none)."""
        if drafted == 0:
            self.plain_steps = DECAY * self.plain_steps + 1.0
            self.guesses = DECAY * self.guesses + (guess_kept is not None)
            self.guesses_kept = DECAY * self.guesses_kept + (guess_kept or 0)
            self.unguessed = 0 if guess_kept is not None else self.unguessed + 1
            self.guessed_run = self.guessed_run + 1 if guess_kept is not None else 0
            if round_ms is not None:
                i = int(guess_kept is not None)
                old = self.step_ms[i]
                self.step_ms[i] = round_ms if np.isnan(old) else (1 - EMA) * old + EMA * round_ms
        self.reached *= DECAY
        self.accepted *= DECAY
        self.reached[:min(drafted, accepted + 1)] += 1.0
        self.accepted[:accepted] += 1.0
        if round_ms is not None and drafted < self.round_ms.size:
            old = self.round_ms[drafted]
            self.round_ms[drafted] = round_ms if np.isnan(old) else (1 - EMA) * old + EMA * round_ms
            self.samples[drafted] += 1
