"""Each committed token's log-probability under the target, and its most likely alternatives.

A log-probability here is the target's own: log_softmax of its raw logits row at that position
(temperature 1, before a grammar mask, top-k/top-p/min-p or temperature), as vLLM's raw logprobs and
OpenAI's. Speculation verifies every committed token on such a row (the verify forward's row j predicts
the token after the j-th draft), so the entries are the ones `ar` computes on its 1-token steps, for
every strategy: the rounds (runtime/round/rounds.py) and the prefill pass their rows here.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from edgespec.errors import GenerationError

MAX_TOP_LOGPROBS = 20     # alternatives per token (OpenAI's chat route allows 20)


@dataclass(frozen=True)
class TokenLogprob:
    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()     # (token id, logprob), most likely first, ties by lower id


def check_top(logprobs) -> int | None:
    """None (off) or the number of alternatives 0..MAX_TOP_LOGPROBS; a one-line GenerationError else."""
    if logprobs is None:
        return None
    if isinstance(logprobs, bool) or not isinstance(logprobs, (int, np.integer)) or \
            not 0 <= logprobs <= MAX_TOP_LOGPROBS:
        raise GenerationError(f"logprobs must be None or an integer in [0, {MAX_TOP_LOGPROBS}] (alternatives per "
                              f"token), got {logprobs!r}"[:200])
    return int(logprobs)


def token_logprobs(rows: np.ndarray, tokens: Sequence[int], top: int) -> list[TokenLogprob]:
    """The entries of `tokens`, token j read on logits row j (rows [len(tokens), V], raw, float)."""
    x = np.asarray(rows[:len(tokens)], dtype=np.float64)
    m = x.max(axis=1, keepdims=True)
    lse = m[:, 0] + np.log(np.exp(x - m).sum(axis=1))
    out = []
    for j, t in enumerate(tokens):
        alts = ()
        if top:
            k = min(top, x.shape[1])
            cand = np.argpartition(-x[j], k - 1)[:k]
            # ties at the cut: every id with the k-th value competes, the lower ids win
            cut = x[j, cand].min()
            cand = np.union1d(cand, np.flatnonzero(x[j] == cut))
            order = np.lexsort((cand, -x[j, cand]))[:k]
            alts = tuple((int(cand[i]), float(x[j, cand[i]] - lse[j])) for i in order)
        out.append(TokenLogprob(int(t), float(x[j, t] - lse[j]), alts))
    return out
