"""Drafts learned across requests: a bounded store of earlier generations (each one's prompt tail and
answer), shared by a decoder and its variants (shared.Shared), from which a round drafts the
continuation of the longest suffix of its context found there (SuffixDecoding's global tree, llama.cpp's
ngram-mod pool). The current request's own text is the prompt lookup's (lookup.py); this store adds
what earlier requests wrote: an agent that re-sends a file, a retried request, a template answer.

Structure (torch-free, O(1)-ish per round): a ring of token ids with the document each position belongs
to, and one hash table of int64 slots (a power of two) mapping hash(scope, n, n tokens) to the position
just after that n-gram's latest occurrence, for n in ORDERS. A slot holds one position and a newer
n-gram overwrites it. A hit is checked against the ring (the tokens, the document's scope, the document
still alive), so a collision, an evicted document or another scope's text is a miss: answers of one
scope never draft for another (docs/runtime.md, "Answer store"). The match found is extended backwards
(up to MAX_MATCH tokens) and can be followed round after round (`follow`); a draft is at most as long as
the match and the document's rest, and within that as long as `draft_length`'s cost model says pays.

Memory: every array is allocated at the first record and never grows; `nbytes` <= the setting. A new
document evicts the oldest whole documents its tokens need room for (oldest first). Only completed
generations are recorded (generation.Generation.finish): an interrupted stream leaves the store as it was.

Drafts from here are verified like any lookup draft (one-hot q: ngram.py), so output is unchanged.
"""
from __future__ import annotations

import hashlib
import math
from collections import OrderedDict, deque
from typing import NamedTuple

import numpy as np

from edgespec.errors import GenerationError

DEFAULT_STORE_MB = 32       # SpeculativeDecoder(options={"answer_store_mb": ...}); 0 turns the store off
MAX_STORE_MB = 4096
MIN_STORE_BYTES = 1 << 16   # the smallest store (tests use small ones to see eviction)
ORDERS = (16, 12, 8, 6, 4, 3)   # n-gram lengths indexed, longest first: a hit's tier is a lower bound on its match
MAX_MATCH = 64              # a hit's match is extended backwards up to this many tokens
PROMPT_TAIL = 64            # prompt tokens recorded before each answer: what leads into it
_MASK = (1 << 64) - 1
_BASE = 0x100000001B3       # FNV-1a's 64-bit prime: the rolling hash's base
_ORDER_SALT = 0x9E3779B97F4A7C15
_M1, _M2 = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB     # splitmix64's finaliser
_POSITION_BYTES = 4 + 8     # a ring position: its token (int32) and its document (int64)
MAX_STORE_DRAFT = 32        # the widest verify a store draft asks for (the cost model picks within it)
PRIOR_ACCEPTANCE, PRIOR_WEIGHT = 0.8, 8.0    # store drafts' acceptance before any (pseudo-positions)
STORE_DECAY = 0.98          # weight of the past per store round in its acceptance counts
COST_SAMPLES = 16           # verify forwards kept per width for the live cost curve


class Match(NamedTuple):
    """A suffix of the context found in the store: the continuation starts at ring position `pos` of
    document `doc` (which ends at `end`); `m` tokens before it match the context's last m."""
    pos: int
    end: int
    doc: int
    m: int


def check_store_mb(value) -> float:
    """The answer_store_mb setting, checked: 0 (off) or a size in MB."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)) or \
            not math.isfinite(value) or not (value == 0 or MIN_STORE_BYTES / 2**20 <= value <= MAX_STORE_MB):
        raise GenerationError(f"answer_store_mb must be 0 (off) or a size in MB between "
                              f"{MIN_STORE_BYTES / 2**20:g} and {MAX_STORE_MB}, got {value!r}")
    return float(value)


def check_scope(scope) -> str | None:
    """A draft_scope: None (the decoder's shared scope) or a str naming a partition of the store."""
    if scope is not None and not isinstance(scope, str):
        raise GenerationError(f"draft_scope must be a str or None, got {type(scope).__name__}")
    return scope


def scope_key(scope: str | None) -> int:
    """A scope's 64-bit key (0 for the shared scope None)."""
    if scope is None:
        return 0
    return int.from_bytes(hashlib.blake2b(scope.encode("utf-8", "surrogatepass"), digest_size=8).digest(), "little") | 1


def _mix(x: int) -> int:
    x ^= x >> 30
    x = (x * _M1) & _MASK
    x ^= x >> 27
    x = (x * _M2) & _MASK
    return x ^ (x >> 31)


def _mix_array(x: np.ndarray) -> np.ndarray:
    x = x ^ (x >> np.uint64(30))
    x = x * np.uint64(_M1)              # uint64 arrays wrap: arithmetic modulo 2^64, as _mix
    x = x ^ (x >> np.uint64(27))
    x = x * np.uint64(_M2)
    return x ^ (x >> np.uint64(31))


def suffix_hashes(tail: list[int], salt: int) -> dict[int, int]:
    """{n: the hash of tail's last n tokens} for n in ORDERS with n <= len(tail) (one pass, Python ints:
    a round's lookup). Equal to `ngram_hashes` at the same positions."""
    h, out = 0, {}
    for n in range(1, min(len(tail), ORDERS[0]) + 1):
        h = (h * _BASE + tail[-n] + 1) & _MASK
        if n in ORDERS:
            out[n] = _mix(h ^ salt ^ ((n * _ORDER_SALT) & _MASK))
    return out


def ngram_hashes(tokens: np.ndarray, salt: int) -> dict[int, np.ndarray]:
    """{n: hashes of tokens[e-n:e] for e = n .. len(tokens)-1} (vectorised: a record), each n-gram
    followed by at least one token."""
    t = tokens.astype(np.uint64) + np.uint64(1)
    size = t.size
    h = np.zeros(size, dtype=np.uint64)             # h[e]: hash of the n tokens before e
    out = {}
    for n in range(1, ORDERS[0] + 1):
        if n >= size:
            break
        h[n:] = h[n:] * np.uint64(_BASE) + t[:size - n]
        if n in ORDERS:
            out[n] = _mix_array(h[n:size] ^ np.uint64(salt ^ ((n * _ORDER_SALT) & _MASK)))
    return out


class AnswerStore:
    """Earlier generations, searched by suffix (module docstring). `max_bytes` = 0: off."""

    def __init__(self, max_bytes: int):
        self.max_bytes = int(max_bytes)
        if self.max_bytes and self.max_bytes < MIN_STORE_BYTES:
            raise GenerationError(f"an answer store needs at least {MIN_STORE_BYTES} bytes, got {max_bytes}")
        if self.max_bytes:      # the table <= 8/9 of the budget, one slot per indexed n-gram at most
            self.slots = 1 << int(math.log2(self.max_bytes * 8 // 9 // 8))
            self.capacity = min((self.max_bytes - 8 * self.slots) // _POSITION_BYTES, self.slots // len(ORDERS))
        else:
            self.slots = self.capacity = 0
        self.table = self.tokens = self.doc_of = None      # allocated at the first record
        self.docs: OrderedDict[int, tuple[int, int, int]] = OrderedDict()   # id -> (start, end, scope key)
        self.head = 0           # global position of the next token (positions never wrap; the ring does)
        self.next_doc = 1
        self.evicted = 0        # documents evicted so far
        self.reached = self.kept = 0.0      # store drafts' positions reached and kept (decayed: `book`)
        self.width_ms: dict[int, deque] = {}    # verify forwards' ms by width (`observe`)
        self._line = None

    @property
    def enabled(self) -> bool:
        return self.capacity > 0

    @property
    def nbytes(self) -> int:
        """Bytes its arrays hold (0 before the first record)."""
        return sum(a.nbytes for a in (self.table, self.tokens, self.doc_of) if a is not None)

    def __len__(self) -> int:
        return len(self.docs)

    def clear(self) -> None:
        """Forget every document (the arrays stay allocated)."""
        self.docs.clear()
        if self.table is not None:
            self.table.fill(0)

    # ------------------------------------------------------------------ recording
    def record(self, prompt_ids, answer_ids, scope: str | None = None) -> None:
        """Add one completed generation: the prompt's last PROMPT_TAIL tokens, then the answer (the last
        `capacity` tokens of it, if longer). Evicts the oldest documents it needs room for."""
        if not self.enabled or not len(answer_ids):
            return
        seq = np.asarray([*list(prompt_ids)[-PROMPT_TAIL:], *answer_ids], dtype=np.int64)[-self.capacity:]
        if seq.size < 2:
            return
        if self.table is None:
            self.table = np.zeros(self.slots, dtype=np.int64)          # position + 1; 0: empty
            self.tokens = np.zeros(self.capacity, dtype=np.int32)
            self.doc_of = np.zeros(self.capacity, dtype=np.int64)
        size, start = seq.size, self.head
        while self.docs and next(iter(self.docs.values()))[0] < start + size - self.capacity:
            self.docs.popitem(last=False)
            self.evicted += 1
        ring = (start + np.arange(size)) % self.capacity
        self.tokens[ring] = seq
        doc = self.next_doc
        self.doc_of[ring] = doc
        key = scope_key(scope)
        for n, hashes in ngram_hashes(seq, key).items():
            slots = (hashes & np.uint64(self.slots - 1)).astype(np.int64)
            # the latest occurrence wins: keep each slot's last write (np.unique on the reversed order)
            slots, first = np.unique(slots[::-1], return_index=True)
            self.table[slots] = start + n + (hashes.size - 1 - first) + 1      # e = n + j: after the n-gram
        self.docs[doc] = (start, start + size, key)
        self.next_doc += 1
        self.head = start + size

    # ------------------------------------------------------------------ lookup
    def find(self, tail: list[int], scope: str | None = None) -> Match | None:
        """The latest recorded occurrence of the longest suffix of `tail` (an n in ORDERS, then extended
        backwards up to MAX_MATCH tokens), in `scope`, followed by at least one token; None when none."""
        if not self.docs:
            return None
        key = scope_key(scope)
        hashes = suffix_hashes(tail, key)
        cap, toks = self.capacity, self.tokens
        for n in ORDERS:
            if n not in hashes:
                continue
            p = int(self.table[hashes[n] & (self.slots - 1)]) - 1      # the continuation's start
            if p < 0:
                continue
            doc_id = int(self.doc_of[(p - 1) % cap])
            doc = self.docs.get(doc_id)
            if doc is None or doc[2] != key or p - n < doc[0] or p >= doc[1]:
                continue                    # evicted, another scope's, or a collision across documents
            if toks[np.arange(p - n, p) % cap].tolist() != tail[-n:]:
                continue                    # a hash collision
            m = n
            while m < MAX_MATCH and m < len(tail) and p - m - 1 >= doc[0] and toks[(p - m - 1) % cap] == tail[-m - 1]:
                m += 1
            return Match(p, doc[1], doc_id, m)
        return None

    def follow(self, match: Match, new: list[int]) -> Match | None:
        """`match` moved past `new` (the tokens the context gained since it was found) where the document
        goes on with exactly those tokens and is still held: the same occurrence, its match longer by
        len(new), with no hash lookup; else None."""
        end = match.pos + len(new)
        if match.doc not in self.docs or end >= match.end or \
                self.tokens[np.arange(match.pos, end) % self.capacity].tolist() != list(new):
            return None
        return Match(end, match.end, match.doc, match.m + len(new))

    def continuation(self, match: Match, limit: int) -> list[int]:
        """Up to `limit` tokens of the match's document from its position on."""
        end = min(match.pos + max(limit, 0), match.end)
        return self.tokens[np.arange(match.pos, end) % self.capacity].tolist()

    def lookup(self, tail: list[int], limit: int, scope: str | None = None) -> tuple[list[int], int]:
        """(the up-to-`limit` tokens that followed the latest recorded occurrence of the longest suffix of
        `tail` (`find`: the match length m), at most m of them; m), or ([], 0). `tail`: the context's
        last tokens (MAX_MATCH of them suffice)."""
        match = self.find(tail, scope) if limit > 0 else None
        if match is None:
            return [], 0
        return self.continuation(match, min(limit, match.m)), match.m

    # ------------------------------------------------------------------ how long a draft pays
    def book(self, drafted: int, kept: int) -> None:
        """One round of store drafts: positions 1..min(drafted, kept + 1) reached, `kept` of them kept."""
        self.reached = STORE_DECAY * self.reached + min(drafted, kept + 1)
        self.kept = STORE_DECAY * self.kept + kept

    def acceptance(self) -> float:
        """Per-position acceptance of store drafts (decayed counts, shrunk toward PRIOR_ACCEPTANCE)."""
        return (self.kept + PRIOR_WEIGHT * PRIOR_ACCEPTANCE) / (self.reached + PRIOR_WEIGHT)

    def observe(self, width: int, ms: float) -> None:
        """A verify forward of `width` tokens took `ms` on this machine (the live cost curve)."""
        self.width_ms.setdefault(width, deque(maxlen=COST_SAMPLES)).append(ms)
        self._line = None

    def costs(self, widths: int, profile_ms=()) -> np.ndarray | None:
        """c(k) for k = 1..widths: the device profile's k-token forward costs (`profile_ms`: the
        generation's records.StepPlan.verify_ms) where given, else a weighted line through the medians of
        the verify forwards seen (two widths at least), extended linearly past the widths known; None
        before either."""
        k = np.arange(1, widths + 1)
        if len(profile_ms):
            c = np.asarray(profile_ms, dtype=np.float64)
            tail = c[len(c) // 2:]
            slope = (tail[-1] - tail[0]) / max(len(tail) - 1, 1)
            return np.where(k <= len(c), c[np.minimum(k, len(c)) - 1], c[-1] + slope * (k - len(c)))
        if self._line is None:
            ws = [w for w, v in self.width_ms.items() if v]
            if len(ws) < 2:
                return None
            med = [float(np.median(self.width_ms[w])) for w in ws]
            slope, icpt = np.polyfit(ws, med, 1, w=[math.sqrt(len(self.width_ms[w])) for w in ws])
            self._line = (max(slope, 0.0), icpt)
        slope, icpt = self._line
        return np.maximum(icpt + slope * k, 1e-3)

    def draft_length(self, cap: int, profile_ms=()) -> int | None:
        """The draft length in 1..cap with the most expected tokens per ms: (1 + sum_{j<=L} a^j) / c(L+1)
        (a: `acceptance`, c: `costs`); None where no cost curve is known yet."""
        if cap <= 1:
            return max(cap, 0)
        c = self.costs(cap + 1, profile_ms)
        if c is None:
            return None
        expected = 1.0 + np.cumsum(self.acceptance() ** np.arange(1, cap + 1))
        return 1 + int(np.argmax(expected / c[1:]))
