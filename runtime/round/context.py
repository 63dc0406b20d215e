"""The drafter's view of the committed text, in its *own* tokenisation.

Same tokenizer: drafter ids are target ids (identity; nothing to do).

Different tokenizers (`HeteroContext`), per committed target token t:
1. a draft token the target accepted is already in the drafter's tokens (it was fed while drafting);
2. else t maps through `target_to_drafter` (same bytes, Ġ/▁ and byte-fallback aware: runtime/bundle/vocab.py);
3. else (no counterpart, e.g. a long target token the drafter lacks): *resync*. Take the committed
   text tail = the last few drafter tokens (the lookbehind) + t's bytes, re-tokenise it with the
   drafter tokenizer, and replace those tokens. The caller crops the drafter KV back to the stable
   prefix (the tokens before the lookbehind) and feeds the rest in its next forward.

Text is handled as bytes (token tables from runtime/bundle/vocab.py, re-encoded by runtime/bundle/reencode.py's
`ByteEncoder.encode_exact`), so a multi-byte character split across tokens survives. Bytes that are not
valid UTF-8 on their own become the drafter's byte tokens (`<0xNN>` or a GPT-2 byte character) when it
has them. Target special tokens map to drafter special
tokens with the same content (e.g. `<|im_end|>`) or are dropped. BOS: the drafter gets its own BOS when
its tokenizer adds one (Gemma adds `<bos>`, Qwen does not), whatever the target does.

The drafter context never affects *correctness* (verify only uses the q the drafter sampled from),
only acceptance; so unusual tokenizers degrade gracefully rather than fail.
"""
from __future__ import annotations

import numpy as np

from edgespec.runtime.bundle.reencode import ByteEncoder
from edgespec.runtime.bundle.vocab import SPECIAL_PREFIX, token_table

LOOKBEHIND = 4          # drafter tokens re-tokenised together with an unmappable target token


class SameContext:
    """Drafter tokens = target tokens."""
    resyncs = 0

    def __init__(self, bundle):
        bos = bundle.drafter.bos_id
        self.drafter_bos = bos if bundle.drafter.add_bos and not bundle.target.add_bos else None
        self.ids: list[int] = []

    def start(self, target_ids: list[int]) -> None:
        self.ids = ([self.drafter_bos] if self.drafter_bos is not None and target_ids[:1] != [self.drafter_bos]
                    else []) + list(target_ids)
        self.resyncs = 0

    def feed_ids(self, target_id: int) -> list[int]:
        """Drafter input ids standing for one drafted target id."""
        return [target_id]

    def append_target(self, target_id: int) -> int:
        """Add one committed target token; returns the index of the first drafter token that changed."""
        self.ids.append(target_id)
        return len(self.ids) - 1


class HeteroContext:
    """Drafter tokens for text committed in the target's tokens (module docstring)."""

    def __init__(self, bundle):
        self.t2d = np.asarray(bundle.target_to_drafter)
        self.t_keys = token_table(bundle.target.tokenizer, bundle.target.vocab_size).keys
        self.enc = ByteEncoder(bundle.drafter.tokenizer, bundle.drafter.vocab_size)
        self.d_keys = self.enc.keys
        self.drafter_bos = bundle.drafter.bos_id if bundle.drafter.add_bos else None
        self.ids: list[int] = []
        self.resyncs = 0

    def _key(self, tid: int) -> bytes | None:
        return self.t_keys[tid] if 0 <= tid < len(self.t_keys) else None

    def encode_bytes(self, data: bytes) -> list[int]:
        """Drafter ids for arbitrary bytes: valid UTF-8 runs are tokenised, stray bytes become byte tokens."""
        return self.enc.encode_bytes(data, self.enc.encode_exact)

    # ------------------------------------------------------------------ target ids -> drafter ids
    def convert(self, target_ids) -> list[int]:
        """Drafter ids for a run of target ids (text runs re-tokenised, specials mapped or dropped)."""
        out: list[int] = []
        buf: list[bytes] = []
        for t in target_ids:
            key = self._key(int(t))
            if key is None or key.startswith(SPECIAL_PREFIX):
                if buf:
                    out += self.encode_bytes(b"".join(buf))
                    buf = []
                d = int(self.t2d[t]) if 0 <= t < len(self.t2d) else -1
                if d >= 0:
                    out.append(d)
            else:
                buf.append(key)
        if buf:
            out += self.encode_bytes(b"".join(buf))
        return out

    def start(self, target_ids: list[int]) -> None:
        ids = self.convert(target_ids)
        if self.drafter_bos is not None and ids[:1] != [self.drafter_bos]:
            ids.insert(0, self.drafter_bos)
        self.ids = ids
        self.resyncs = 0

    def feed_ids(self, target_id: int) -> list[int]:
        d = int(self.t2d[target_id])
        return [d] if d >= 0 else self.convert([target_id])

    def append_target(self, target_id: int) -> int:
        """Add one committed target token; returns the index of the first drafter token that changed
        (the caller crops the drafter KV to at most that)."""
        d = int(self.t2d[target_id])
        if d >= 0:
            self.ids.append(d)
            return len(self.ids) - 1
        key = self._key(target_id)
        if key is None or key.startswith(SPECIAL_PREFIX):   # a target special with no drafter counterpart
            return len(self.ids)
        # resync: re-tokenise the lookbehind tail together with the new token's bytes
        start = len(self.ids)
        while start > 0 and len(self.ids) - start < LOOKBEHIND:
            k = self.d_keys[self.ids[start - 1]]
            if k is None or k.startswith(SPECIAL_PREFIX) or self.ids[start - 1] == self.drafter_bos:
                break
            start -= 1
        tail = self.enc.bytes_of(self.ids[start:]) + key
        new = self.encode_bytes(tail)
        stable = start
        while stable < len(self.ids) and stable - start < len(new) and self.ids[stable] == new[stable - start]:
            stable += 1
        self.ids[start:] = new
        self.resyncs += 1
        return stable


def drafter_context(bundle):
    """The decoder's text context (token tables built once); each generation wraps it in a DrafterContext."""
    return SameContext(bundle) if bundle.same_tokenizer else HeteroContext(bundle)


class DrafterContext:
    """The drafter's side of one generation: `text` (the committed text in drafter tokens, a SameContext
    or HeteroContext), the `window` of it that its KV holds, and its KV `runner`. Drafting appends to
    `ids`; after each round `sync` makes them the committed text again and crops the KV to what still
    matches: the one place the drafter is resynchronised with the target."""

    def __init__(self, text, runner, window: "DrafterWindow"):
        self.text, self.runner, self.window = text, runner, window

    @property
    def ids(self) -> list[int]:
        return self.text.ids

    def draft(self, target_id: int) -> None:
        """A drafted target id enters the context (as the drafter tokens standing for it)."""
        self.ids.extend(self.text.feed_ids(target_id))

    def inputs(self) -> list[int]:
        """The drafter tokens its KV lacks within its window (DrafterWindow.inputs)."""
        return self.window.inputs(self.ids, self.runner)

    def room(self) -> int:
        """KV positions the window would hold after feeding the whole context."""
        return self.window.room(len(self.ids))

    def sync(self, keep: int, committed: list[int]) -> None:
        """ids[:keep] is committed text; `committed` (target ids) follows it. Cut the context back to
        keep, append `committed` in drafter tokens, and keep the drafter KV that the new context still
        matches (a re-tokenisation may change earlier drafter tokens: HeteroContext.append_target)."""
        ids = self.ids
        fed = ids[keep:self.window.covered(self.runner.length)]     # tokens already in the drafter's KV
        del ids[keep:]
        valid = keep
        for tok in committed:
            valid = min(valid, self.text.append_target(tok))
        ids = self.ids
        if valid == keep:
            same = 0
            while same < len(fed) and keep + same < len(ids) and ids[keep + same] == fed[same]:
                same += 1
            valid += same
        self.window.keep_valid(valid, self.runner)


REFILL_FRACTION = 4       # a refill keeps the last size // 4 positions


class DrafterWindow:
    """The part of the committed text the drafter's KV holds: `sink` + ctx.ids[anchor:covered].

    A drafter guesses the next few tokens from recent context, so it never needs the whole prompt:
    its KV holds at most `size` positions. A text longer than the window starts from its last size // 4
    tokens, and whenever the KV would grow past `size` it restarts from the last size // 4 again (one
    batched forward of those: a third of a drafter position re-fed per generated token, at a fraction of
    a drafting step's cost per position). The first fill is a refill like the others, for every text
    longer than size // 4, short prompts included: it feeds the last size // 4 tokens, and the window
    grows from there as the text does. Filling all `size` positions at once bought one round of wider
    context at a cost of a large share of a short answer's decode (docs/results.md). A drafter whose
    tokenizer adds a BOS keeps it in front of a window that starts later (`sink`). size None: the whole
    text (no window).
    The window only changes what the drafter proposes, never what verification accepts."""

    def __init__(self, size: int | None, drafter_bos: int | None = None):
        self.size = size
        self.drafter_bos = drafter_bos
        self.anchor = 0
        self.sink: list[int] = []
        self.refills = 0                # re-anchorings after the first fill (stats)

    def covered(self, kv_length: int) -> int:
        """ctx.ids[:covered] is what a KV of kv_length positions holds (from anchor on)."""
        return self.anchor + max(0, kv_length - len(self.sink))

    def inputs(self, ids: list[int], runner) -> list[int]:
        """The drafter ids to feed so that its KV ends with ids[-1], re-anchoring (and resetting the
        runner) when the KV would exceed the window; at least one id (the last is re-run for fresh
        logits when the KV already holds everything)."""
        n = len(ids)
        first = runner.length == 0 and self.anchor == 0
        if self.size is not None and (self.anchor >= n or n - self.anchor + len(self.sink) > self.size
                                      or first and n > self.size // REFILL_FRACTION):
            anchor = max(0, n - max(1, self.size // REFILL_FRACTION))
            if anchor != self.anchor or runner.length:
                self.refills += not first
                runner.reset()
            self.anchor = anchor
            bos = self.drafter_bos
            self.sink = [bos] if bos is not None and anchor > 0 and ids[0] == bos else []
        kv = runner.length
        if self.covered(kv) >= n:
            runner.crop(kv - 1)
            kv -= 1
        return self.sink[min(kv, len(self.sink)):] + ids[self.covered(kv):]

    def keep_valid(self, valid: int, runner) -> None:
        """Crop the KV to what ctx.ids[:valid] (unchanged text) still supports."""
        if valid < self.anchor:
            runner.reset()
        else:
            runner.crop(min(runner.length, valid - self.anchor + len(self.sink)))

    def room(self, n: int) -> int:
        """KV positions the window would hold after feeding up to ctx position n."""
        return n - self.anchor + len(self.sink)
