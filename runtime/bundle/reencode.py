"""Bytes -> ids of one tokenizer: text spelled in another tokenizer's tokens, re-encoded. Torch-free.

Token bytes come from runtime/bundle/vocab.py's tables (Ġ/▁ and byte-fallback aware; added special tokens
have `SPECIAL_PREFIX` keys, never text). `ByteEncoder.encode_bytes` splits the bytes into valid UTF-8
runs, which the tokenizer encodes without special tokens and without a SentencePiece-style dummy
prefix (the text continues a line), and stray bytes (invalid UTF-8 on their own: part of a character
split across tokens), which become the tokenizer's single-byte tokens where it has them (dropped where
it has none). Two ways to drop a dummy prefix, kept as their callers have always used them:
  `encode_exact`          the drafter context (runtime/round/context.py): the ids must spell exactly the text;
                          a leading space token is dropped or its "▁xy" swapped for "xy", else the byte
                          tokens if the tokenizer has one for every byte, else the plain encoding;
  `encode_continuation`   SLEM's proposals (runtime/round/slem.py): the extra leading spaces are measured by
                          length and removed from the first token (nothing if no such token exists).
`retokenise` is calibrate's per-token form (counts moved between vocabularies, calibrate/counts.py):
one token's bytes, all-or-nothing. `continuation_tokenizer` drops the dummy prefix in the tokenizer
itself (calibrate's raw-text counts: chunks that continue a document).
"""
from __future__ import annotations

import json
from typing import Any, Callable

from tokenizers import Tokenizer

from edgespec.runtime.bundle.vocab import SPECIAL_PREFIX, as_tokenizer, token_table


class ByteEncoder:
    """Ids of one tokenizer for bytes (module docstring). `size`: the model's vocabulary size."""

    def __init__(self, tokenizer: Any, size: int | None = None):
        self.tok = as_tokenizer(tokenizer)
        table = token_table(self.tok, size)
        self.keys = table.keys                           # per id; SPECIAL_PREFIX + content for specials
        self.text_keys = table.text_keys()               # the same, None for specials
        self.canonical = table.canonical()
        self.byte_ids = [self.canonical.get(bytes([b])) for b in range(256)]

    # ------------------------------------------------------------------ pieces
    def encode(self, text: str) -> list[int]:
        """The tokenizer's own encoding (no special tokens added)."""
        return self.tok.encode(text, add_special_tokens=False).ids

    def text_key(self, i: int) -> bytes | None:
        """The bytes of id i, None for special, undecodable or out-of-range ids."""
        return self.text_keys[i] if 0 <= i < len(self.text_keys) else None

    def bytes_of(self, ids) -> bytes:
        """The ids' keys joined (a special token spells its SPECIAL_PREFIX key)."""
        return b"".join(self.keys[i] or b"" for i in ids)

    def byte_tokens(self, data: bytes) -> list[int]:
        """The single-byte token of each byte, skipping bytes that have none."""
        return [i for i in (self.byte_ids[b] for b in data) if i is not None]

    # ------------------------------------------------------------------ text without a dummy prefix
    def encode_exact(self, text: str) -> list[int]:
        """Ids whose bytes are exactly `text` (no special tokens, no dummy prefix)."""
        want = text.encode("utf-8")
        ids = self.encode(text)
        got = self.bytes_of(ids)
        if got == want:
            return ids
        if got == b" " + want and ids:     # a SentencePiece dummy prefix (prepend_scheme "first")
            first = self.keys[ids[0]] or b""
            if first == b" ":
                return ids[1:]
            fixed = self.canonical.get(first[1:])
            if fixed is not None:
                return [fixed] + ids[1:]
        byte_ids = self.byte_tokens(want)
        return byte_ids if len(byte_ids) == len(want) else ids

    def encode_continuation(self, text: str) -> list[int]:
        """Encode text that continues a line: undo a SentencePiece-style prepended "▁" if the
        tokenizer added one (drop a bare "▁" token, or swap "▁xy" for "xy" when that is a token)."""
        data = text.encode("utf-8")
        ids = self.encode(text)
        first = self.text_key(ids[0]) if ids else None
        lead = sum(len(self.text_key(t) or b"") for t in ids) - len(data)
        if lead <= 0 or first is None or not first.startswith(b" " * lead):
            return ids
        if len(first) == lead:
            return ids[1:]
        rest_id = self.canonical.get(first[lead:])
        return [rest_id] + ids[1:] if rest_id is not None else []

    # ------------------------------------------------------------------ arbitrary bytes
    def encode_bytes(self, data: bytes, encode_text: Callable[[str], list[int]] | None = None) -> list[int]:
        """Ids for arbitrary bytes: valid UTF-8 runs through `encode_text` (default `encode_exact`),
        stray bytes as single-byte tokens (skipped where the tokenizer has none)."""
        encode_text = encode_text or self.encode_exact
        out: list[int] = []
        run: list[str] = []
        for ch in data.decode("utf-8", errors="surrogateescape"):
            if "\udc80" <= ch <= "\udcff":          # an undecodable byte
                if run:
                    out += encode_text("".join(run))
                    run = []
                out += self.byte_tokens(bytes([ord(ch) - 0xDC00]))
            else:
                run.append(ch)
        if run:
            out += encode_text("".join(run))
        return out

    def retokenise(self, key: bytes) -> list[int] | None:
        """Ids for one token's bytes, or None: special keys and empty encodings give None; bytes that
        are not valid UTF-8 as a whole map byte by byte onto single-byte tokens (None if one is missing)."""
        if key.startswith(SPECIAL_PREFIX):
            return None
        try:
            text = key.decode("utf-8")
        except UnicodeDecodeError:
            ids = [self.byte_ids[b] for b in key]
            return None if any(i is None for i in ids) else ids
        return list(self.encode(text)) or None


def continuation_tokenizer(tokenizer):
    """A copy of the tokenizer for chunks that continue a document: no SentencePiece-style prefix
    space (Metaspace prepend_scheme, Prepend normalizer), which the whole text has only at its start.
    The tokenizer itself when it has none."""
    data = json.loads(tokenizer.to_str())
    changed = False

    def fix(node):
        nonlocal changed
        if isinstance(node, dict):
            if node.get("type") == "Metaspace":
                if node.get("prepend_scheme") in ("first", "always"):
                    node["prepend_scheme"], changed = "never", True
                if node.get("add_prefix_space"):
                    node["add_prefix_space"], changed = False, True
            for key, value in list(node.items()):
                if isinstance(value, list):
                    kept = [v for v in value if not (isinstance(v, dict) and v.get("type") == "Prepend")]
                    if len(kept) != len(value):
                        node[key], changed = kept, True
                fix(node[key])
        elif isinstance(node, list):
            for v in node:
                fix(v)

    if isinstance(data.get("normalizer"), dict) and data["normalizer"].get("type") == "Prepend":
        data["normalizer"], changed = None, True
    fix(data.get("normalizer"))
    fix(data.get("pre_tokenizer"))
    return Tokenizer.from_str(json.dumps(data)) if changed else tokenizer
