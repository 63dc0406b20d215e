"""`slrs1`: String-Level Rejection Sampling (heterogeneous-vocabularies paper, Algorithm 3) with a
lookahead of ONE drafter token.

Alg. 3 samples drafter tokens d_1..d_i, tokenises their string into target tokens and verifies the first,
t_1, by rejection sampling against psi(t_1), the probability that the procedure proposes t_1 (Thm. 3.2).
With i = 1 and t_1 = first(d), the longest target token whose string prefixes d's (decoded bytes:
runtime/bundle/vocab.py, so byte-level `Ġ` and SentencePiece `▁` compare):

    psi_1(t) = sum_{d : first(d) = t} q(d)

This is TLI's law (tli.py) with the exact-string index map replaced by `first`: a kept column outside
the target vocabulary still proposes the target token its string starts with, where TLI drops it and
renormalises. Added specials (no string) keep the bundle's map. The draft is a target id; the drafter
takes its re-encoding like any drafted target id, and verify.py needs only the psi_1 the draft was
sampled from, so decoding stays lossless whatever `first` is. A longer lookahead needs one drafter
forward per branch and its psi a sum over the drafter sequences that spell t (docs/study-real-pairs.md
measures both).
"""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from edgespec.errors import GenerationError
from edgespec.runtime.samplers.sampling import SamplingParams
from edgespec.runtime.samplers.tli import KeptColumns, kept_columns, target_argmax, tli_column_probs
from edgespec.runtime.bundle.vocab import token_table

MAX_KEY_BYTES = 128          # longer keys are never prefixes worth matching (runs of spaces, '=' ...)


def text_keys(tokenizer, size: int) -> list:
    """Decoded bytes of every id (None for added specials and ids past the tokenizer)."""
    return token_table(tokenizer, size).text_keys()[:size]


def key_index(keys: list) -> dict:
    """bytes -> lowest id with those bytes (ids sharing a string propose the same thing)."""
    out: dict = {}
    for i, k in enumerate(keys):
        if k and k not in out:
            out[k] = i
    return out


def longest_prefix_ids(strings: list, vocab: dict) -> np.ndarray:
    """For each string, the id of the longest `vocab` key that is a prefix of it (-1 if none)."""
    longest = min(max((len(k) for k in vocab), default=0), MAX_KEY_BYTES)
    out = np.full(len(strings), -1, dtype=np.int64)
    for i, s in enumerate(strings):
        if not s:
            continue
        for n in range(min(len(s), longest), 0, -1):
            j = vocab.get(s[:n])
            if j is not None:
                out[i] = j
                break
    return out


def first_token_map(bundle) -> np.ndarray:
    """[K] per kept column: first(d), the target id of the longest target token prefixing its string;
    the bundle's own map where the column has no string (added specials)."""
    v_t = int(bundle.target.vocab_size)
    t_index = key_index(text_keys(bundle.target.tokenizer, v_t))
    d_keys = text_keys(bundle.drafter.tokenizer, int(bundle.drafter.vocab_size))
    kept = [d_keys[i] if i < len(d_keys) else None for i in np.asarray(bundle.draft_ids)]
    first = longest_prefix_ids(kept, t_index)
    return np.where(first >= 0, first, np.asarray(bundle.index_map, dtype=np.int64))


def check(bundle, options) -> None:
    if bundle.drafter is None:
        raise GenerationError("strategy 'slrs1' needs a drafter; this bundle is target-only")


def prepare(bundle, options) -> KeptColumns:
    """TLI's precomputed state over the `first` map."""
    mapped = SimpleNamespace(index_map=first_token_map(bundle), target=bundle.target)
    return kept_columns(mapped, options)


_T1 = SamplingParams(temperature=1.0)


def greedy(state: KeptColumns, kept_logits: np.ndarray) -> int:
    """argmax of psi_1 (columns sharing a first token add up) at temperature 1."""
    return target_argmax(tli_column_probs(kept_logits, state, _T1), state)
