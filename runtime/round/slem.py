"""String-Level Exact Match (heterogeneous-vocabularies paper, Algorithm 2 and §3.2).

The drafter drafts in its *own* vocabulary; the drafted text is re-tokenised with the *target*
tokenizer right after the committed text; the target verifies the proposed target tokens by exact
match against its own samples (argmax when greedy, a draw from its processed p when sampling).
Each emitted token is therefore the target's own sample given the committed prefix: lossless at any
temperature, whatever the proposal. The proposal only decides how many tokens one verify yields.

Re-tokenisation (`SlemTranslator.propose`) works on bytes, so multi-byte UTF-8 characters split across
drafter tokens, or split between the committed text and the draft, are handled:
  1. draft bytes = the drafter tokens' bytes, up to the first special token (which is proposed as its
     target counterpart, e.g. an end-of-turn token, when the drafter's text was used up);
  2. lookbehind window = the last `lookbehind` committed target tokens (no special tokens, starting on
     a character boundary); text = window bytes + draft bytes, less a trailing incomplete character;
  3. encode the text with the target tokenizer (stray, invalid-UTF-8 bytes as single-byte tokens) and
     align it with the window:
     a. the encoding starts with the window's own tokens: propose what follows (the common case);
     b. realign, when a token merges across the boundary or the tokenizer normalises text
        (non-injective): the encoding has a token boundary exactly at the end of the window's bytes
        -> propose from there; else the longest suffix of the window found in the encoding (the
        paper's longest overlap) -> propose what follows it; else encode the draft text alone.
     Every b-case counts as one realignment in the stats.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from edgespec.runtime.bundle.reencode import ByteEncoder
from edgespec.runtime.round.rounds import Draft
from edgespec.runtime.bundle.vocab import as_tokenizer, token_table


@dataclass
class Proposal:
    ids: list[int]                 # proposed target ids, to append after the committed tokens
    realigned: bool = False        # the plain window match failed and a realignment was used
    text_bytes: int = 0            # draft bytes turned into text (for diagnostics)


def _is_continuation(b: int) -> bool:
    return 0x80 <= b < 0xC0


def _complete_chars(data: bytes) -> int:
    """Length of `data` without a trailing, incomplete UTF-8 character (which later drafts may finish)."""
    for back in range(1, min(4, len(data)) + 1):
        b = data[-back]
        if not _is_continuation(b):
            need = 2 if 0xC0 <= b < 0xE0 else 3 if 0xE0 <= b < 0xF0 else 4 if 0xF0 <= b < 0xF8 else 1
            return len(data) - back if need > back else len(data)
    return len(data)


@dataclass
class SlemTranslator:
    """Drafter ids -> proposed target ids, against the committed target ids (see module docstring)."""
    target_tokenizer: Any
    drafter_tokenizer: Any
    drafter_to_target: np.ndarray
    target_vocab_size: int | None = None
    drafter_vocab_size: int | None = None
    lookbehind: int = 8
    realignments: int = field(default=0, init=False)

    def __post_init__(self):
        self.target_tokenizer = as_tokenizer(self.target_tokenizer)
        self.drafter_tokenizer = as_tokenizer(self.drafter_tokenizer)
        self._target = ByteEncoder(self.target_tokenizer, self.target_vocab_size)
        self._t_bytes = self._target.text_keys                     # target id -> bytes, None for specials
        # drafter id -> bytes, None for specials
        self.drafter_bytes = token_table(self.drafter_tokenizer, self.drafter_vocab_size).text_keys()

    # ------------------------------------------------------------------ pieces
    def target_bytes(self, tid: int) -> bytes | None:
        return self._t_bytes[tid] if 0 <= tid < len(self._t_bytes) else None

    def draft_bytes(self, draft: Sequence[int]) -> tuple[bytes, int | None]:
        """(bytes of the draft up to its first special/unknown token, that token's target id or None)."""
        out = bytearray()
        for d in draft:
            d = int(d)
            b = self.drafter_bytes[d] if 0 <= d < len(self.drafter_bytes) else None
            if b is None:
                t = int(self.drafter_to_target[d]) if 0 <= d < self.drafter_to_target.shape[0] else -1
                return bytes(out), (t if t >= 0 else None)
            out += b
        return bytes(out), None

    def window(self, committed: Sequence[int]) -> list[int]:
        """The last `lookbehind` committed ids after the last special one, starting on a character boundary."""
        win: list[int] = []
        for tid in reversed(committed[-self.lookbehind:] if self.lookbehind else []):
            if self.target_bytes(int(tid)) is None:
                break
            win.append(int(tid))
        win.reverse()
        while win and (not self._t_bytes[win[0]] or _is_continuation(self._t_bytes[win[0]][0])):
            win.pop(0)
        return win

    def encode(self, text: str) -> list[int]:
        return self._target.encode(text)

    # ------------------------------------------------------------------ the proposal
    def propose(self, committed: Sequence[int], draft: Sequence[int]) -> Proposal:
        draft_b, special = self.draft_bytes(draft)
        used = _complete_chars(draft_b)
        win = self.window(committed)
        win_b = b"".join(self._t_bytes[t] for t in win)
        ids: list[int] = []
        realigned = False
        if used:
            text_b = win_b + draft_b[:used]
            ids, realigned = self._align(win, win_b, text_b, self.encode_bytes(text_b))
        if special is not None and used == len(draft_b):
            ids.append(special)
        if realigned:
            self.realignments += 1
        return Proposal(ids, realigned, used)

    def _align(self, win: list[int], win_b: bytes, text_b: bytes, enc: list[int]) -> tuple[list[int], bool]:
        n = len(win)
        if enc[:n] == win:                                                       # a. plain match
            return enc[n:], False
        pieces = [self.target_bytes(t) or b"" for t in enc]
        lead = sum(map(len, pieces)) - len(text_b)          # a prepended dummy "▁" (SentencePiece) shows here
        ends = np.cumsum([len(p) for p in pieces]) - max(lead, 0)
        faithful = b"".join(pieces)[max(lead, 0):] == text_b          # no normaliser changed the text
        hit = np.flatnonzero(ends == len(win_b))
        if faithful and hit.size:                                                # b1. token boundary at the join
            return enc[int(hit[0]) + 1:], True
        for m in range(n if not faithful else 0, 0, -1):                         # b2. longest overlap (normalised text)
            suffix = win[n - m:]
            for i in range(len(enc) - m, -1, -1):
                if enc[i:i + m] == suffix and ends[i + m - 1] <= len(win_b):
                    return enc[i + m:], True
        return self.encode_bytes(text_b[len(win_b):]), True                     # b3. the draft text alone

    def encode_bytes(self, data: bytes) -> list[int]:
        """Target ids whose bytes are `data`: valid UTF-8 runs are tokenised (no dummy prefix), stray
        bytes (invalid UTF-8, e.g. the rest of a character the committed text left open) become the
        target's single-byte tokens when it has them."""
        return self._target.encode_bytes(data, self._target.encode_continuation)

    def _encode_no_dummy_prefix(self, data: bytes) -> list[int]:
        """Encode text that continues a line (runtime/bundle/reencode.py, `ByteEncoder.encode_continuation`)."""
        return self._target.encode_continuation(data.decode("utf-8"))


# --------------------------------------------------------------------------- strategy `slem`
# Its propose/accept pieces of the one decode round (rounds.speculative_round); strategies.py registers them.

@dataclass
class SlemState:
    translator: SlemTranslator
    draft_ids: np.ndarray                # kept column -> drafter id
    stop_ids: frozenset                  # drafter ids that end a draft (specials / EOS)
    max_proposal: int                    # cap on proposed target tokens per round (x gamma)


def prepare(bundle, options) -> SlemState:
    options = options or {}
    tr = SlemTranslator(bundle.target.tokenizer, bundle.drafter.tokenizer, bundle.drafter_to_target,
                        bundle.target.vocab_size, bundle.drafter.vocab_size,
                        lookbehind=int(options.get("slem_lookbehind", 8)))
    stops = frozenset(i for i, b in enumerate(tr.drafter_bytes) if b is None) | frozenset(bundle.drafter.eos_ids)
    return SlemState(tr, np.asarray(bundle.draft_ids), stops, int(options.get("slem_max_proposal", 3)))


def propose(gen, gamma: int) -> Draft:
    """Algorithm 2, lines 3-8: the drafter drafts up to gamma tokens in its own vocabulary, greedily
    (for exact-match verification the draft maximising P(accept) = p(d) is the most likely one, and
    the drafter's argmax is its best guess: better than a draw from q, whose acceptance is
    sum_d q(d) p(d)); the draft text is re-tokenised for the target (SlemTranslator.propose).
    The draft's drafter tokens stay in the context only until the round's commit (rounds.commit ->
    DrafterContext.sync), which keeps the drafter KV of those the committed text reproduces."""
    state, ids = gen.prepared, gen.drafter_ctx.ids
    mark = len(ids)
    draft: list[int] = []
    for _ in range(gamma):
        d = int(state.draft_ids[int(np.argmax(gen.draft_forward()))])
        draft.append(d)
        if d in state.stop_ids:
            break
        ids.append(d)
    look = state.translator.lookbehind
    committed_tail = (gen.prompt_ids[-look:] + gen.generated[-look:])[-look:]
    before = state.translator.realignments
    proposal = state.translator.propose(committed_tail, draft).ids
    gen.stats.slem_realignments += state.translator.realignments - before
    remaining = gen.max_new_tokens - len(gen.generated)
    proposal = proposal[:max(0, min(remaining - 1, state.max_proposal * gamma))]
    return Draft(tokens=proposal, keep=[mark] * (len(proposal) + 1), refeed=True)


def accept(gen, logits: np.ndarray, draft: Draft) -> tuple[int, int]:
    """Algorithm 2, lines 9-11: the target picks its own token at each position (gen.pick: argmax, or
    a draw from its processed p); accept proposals while they are equal; return (accepted, the
    target's token at the first mismatch, or its bonus token after a full match)."""
    n_acc = 0
    while True:
        t = gen.pick(logits[n_acc], n_acc)
        if n_acc == len(draft.tokens) or t != draft.tokens[n_acc]:
            return n_acc, t
        n_acc += 1
