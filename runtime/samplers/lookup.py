"""Prompt lookup: the tokens that followed the latest earlier occurrence of the context's last n tokens.
ngram.py drafts with it; rounds.py's plain steps take one free guess from it (`plain_step`). Beside it,
`with_store` offers the answer store's continuation (answer_store.py: earlier requests' text) where that
matches a longer suffix.

Where the output is JSON (a grammar: tool calls, response_format), text the prompt holds comes back
inside JSON strings: an agent writes back the file it read as write_file's `content`, newlines as `\\n`
and quotes as `\\"`, so its tokens match the prompt's only within a line. `json_string_view` is the
prompt as it reads there (json.dumps's escapes, in the same tokenizer's ids), searched where the context
itself has no occurrence of the same length (docs/results.md, 2026-11-28: how often its guesses are right).
"""
from __future__ import annotations

import json

import numpy as np

from edgespec.runtime.samplers.answer_store import MAX_MATCH

DEFAULT_MAX_N = 4           # the longest suffix searched (ngram_max_n)
# the shortest store match that drafts: shorter ones are chance in other requests' text (on new text the
# store matched 3 tokens in most rounds) and would displace the drafter; a re-sent file matches far longer
STORE_MIN_MATCH = 8
LOOKBACK = 4096             # search the last tokens only: O(LOOKBACK) per round
VIEW_TOKENS = 16384         # the JSON view's last tokens kept (where the prompt's latest files are)


def lookup(history: np.ndarray, max_n: int, gamma: int, min_n: int = 1,
           view: np.ndarray | None = None) -> tuple[list[int], int]:
    """(the up-to-gamma tokens that followed the latest earlier occurrence of history's last n tokens,
    n) for the largest n in max_n..min_n that has one, in history or else in `view` (json_string_view);
    ([], 0) when none."""
    hist = history[-LOOKBACK:]
    if hist.shape[0] < 2:
        return [], 0
    searched = [(hist, suffix_ends(hist, hist, max_n))]          # the context itself first
    if view is not None:
        searched.append((view, suffix_ends(view, hist, max_n)))
    for n in range(min(max_n, hist.shape[0] - 1), min_n - 1, -1):
        for text, ends in searched:
            if n in ends:
                start = ends[n] + 1
                return text[start:start + gamma].tolist(), n
    return [], 0


def suffix_ends(text: np.ndarray, hist: np.ndarray, max_n: int) -> dict[int, int]:
    """{n: the last position p of `text` followed by a token (p < len(text) - 1) where text[p - n + 1: p + 1]
    == hist's last n} for n = 1..max_n that occur: the positions holding hist's last token, then filtered
    token by token backwards (O(len(text)) once, then O(hits)). With text = hist: earlier occurrences
    of its own suffix (the suffix itself ends at the last position, which is never a p)."""
    cand = np.flatnonzero(text[:-1] == hist[-1])
    ends = {}
    for n in range(1, min(max_n, hist.shape[0]) + 1):
        if n > 1:
            cand = cand[cand >= n - 1]
            cand = cand[text[cand - (n - 1)] == hist[-n]]
        if not cand.size:
            break
        ends[n] = int(cand[-1])
    return ends


def json_string_view(tokenizer, ids) -> np.ndarray:
    """`ids`' text as it reads inside a JSON string (json.dumps's escapes without the quotes; non-ASCII
    kept, as a model writes it), encoded by the same tokenizer: its last VIEW_TOKENS ids (module docstring).
    About 2 ms per 1,000 prompt tokens (of the last VIEW_TOKENS), once a generation."""
    text = tokenizer.decode(list(ids)[-VIEW_TOKENS:], skip_special_tokens=False)   # escaping only lengthens it
    escaped = json.dumps(text, ensure_ascii=False)[1:-1]
    return np.asarray(tokenizer.encode(escaped, add_special_tokens=False).ids[-VIEW_TOKENS:], dtype=np.int64)


def store_wins(n: int, m: int) -> bool:
    """Whether the answer store's match of m tokens replaces the prompt lookup's of n: longer, and
    STORE_MIN_MATCH or more."""
    return m > n and m >= STORE_MIN_MATCH


def with_store(store, scope, history: np.ndarray, found: list[int], n: int, limit: int) -> tuple[list[int], int, bool]:
    """(tokens, match length, from the store): the answer store's continuation (at most as long as its
    match, and `limit`) when its match is longer than the prompt lookup's n and STORE_MIN_MATCH or more,
    else (found, n). A store that is off, or has nothing for this scope, changes nothing."""
    if store is None or not store.docs:
        return found, n, False
    got, m = store.lookup(history[-MAX_MATCH:].tolist(), limit, scope)
    return (got, m, True) if store_wins(n, m) else (found, n, False)


def guess_record(prompt_ids, output_ids, max_n: int = DEFAULT_MAX_N, limit: int = 512) -> tuple[int, int]:
    """(steps, guesses kept) had the first `limit` tokens of output_ids after the first been decoded by
    padded plain steps that each carry a lookup guess (rounds.plain_step): a step feeds the last token and
    the guess, and a kept guess commits two tokens. Exact for greedy decoding (the same tokens come out)."""
    history = np.asarray([*prompt_ids, *output_ids[:limit + 1]], dtype=np.int64)
    i, steps, kept = len(prompt_ids) + 1, 0, 0      # the first output token comes from the prefill
    while i < history.size:
        guess, _ = lookup(history[:i], max_n, 1)
        hit = int(bool(guess) and i + 1 < history.size and guess[0] == history[i])
        steps, kept, i = steps + 1, kept + hit, i + 1 + hit
    return steps, kept
