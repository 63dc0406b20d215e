"""Prompt-lookup drafting (`ngram`): draft the continuation of the latest earlier occurrence of the
last n tokens (n = max_n .. 1) of prompt + output; no drafter model.

The draft distribution is one-hot on the proposed token, so verify.py's rejection sampling accepts d
with probability min(1, p(d)) = p(d) and otherwise draws from norm(max(p - onehot(d), 0)), which is
p conditioned on "not d": the emitted token has law p(d) 1[d] + (1 - p(d)) p(.|not d) = p. Greedy
verification accepts while d is the target's argmax. Lossless either way.

`ngram-tli` combines it with the model drafter: an n-gram draft when a match of 2+ tokens exists, the
drafter's TLI draft otherwise (the drafter's context is kept in step either way, see rounds.draft_tokens).
"""
from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from edgespec.errors import GenerationError
from edgespec.runtime.rounds import Draft, draft_tokens, lookup_draft

DEFAULT_MAX_N = 4
LOOKBACK = 4096             # search the last tokens only: O(LOOKBACK) per round
COMBINED_MIN_N = 2          # ngram-tli: a 1-token match is a weaker guess than the drafter's


def lookup(history: np.ndarray, max_n: int, gamma: int, min_n: int = 1) -> list[int]:
    """The up-to-gamma tokens that followed the latest earlier occurrence of history's last n tokens,
    for the largest n in max_n..min_n that has one; [] when none."""
    hist = history[-LOOKBACK:]
    size = hist.shape[0]
    for n in range(min(max_n, size - 1), min_n - 1, -1):
        windows = sliding_window_view(hist[:size - 1], n)      # starts i with i + n <= size - 1
        hits = np.flatnonzero((windows == hist[size - n:]).all(axis=1))
        if hits.size:
            start = int(hits[-1]) + n
            return hist[start:start + gamma].tolist()
    return []


def check(bundle, options) -> None:
    n = (options or {}).get("ngram_max_n", DEFAULT_MAX_N)
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise GenerationError(f"ngram_max_n must be an integer >= 1, got {n!r}")


def _find(gen, gamma: int) -> list[int]:
    max_n = int(gen.dec.options.get("ngram_max_n", DEFAULT_MAX_N))
    history = np.asarray(gen.prompt_ids + gen.generated, dtype=np.int64)
    return lookup(history, max_n, gamma, min_n=1 if gen.drafter is None else COMBINED_MIN_N)


def source(gen) -> str:
    """ngram-tli: "ngram" when the n-gram lookup has a continuation this round, else "drafter". The two
    have their own draft-length governors (draft_length="auto"): a long n-gram draft costs one verify
    forward, a drafter draft a drafter forward per token. The lookup is kept for `propose`."""
    gen.ngram_found = _find(gen, gen.dec.draft_length)
    return "ngram" if gen.ngram_found else "drafter"


def propose(gen, gamma: int) -> Draft:
    """The n-gram continuation when there is one; else the drafter's draft (ngram-tli), or none."""
    found = getattr(gen, "ngram_found", None)
    found = _find(gen, gamma) if found is None else found[:gamma]
    gen.ngram_found = None
    if found or gen.drafter is None:
        return lookup_draft(gen, found)
    return draft_tokens(gen, gamma)
