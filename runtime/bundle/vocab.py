"""Token-string maps between two tokenizers. Torch-free; shared by runtime, export and calibrate.

Tokens of two tokenizers are matched by the *bytes* they decode to:
- GPT-2-style byte-level BPE: every character of a token stands for one byte through the GPT-2
  byte table (``Ġ`` = space, ``Ċ`` = newline, and non-ASCII text appears as "mojibake");
  mapping it back gives the raw UTF-8 bytes.
- SentencePiece-style (Metaspace / Replace): ``▁`` is a space, ``<0xNN>`` byte-fallback tokens
  stand for the single byte NN, everything else is its UTF-8 encoding.
- Added/special tokens (``<|im_end|>``, ``<bos>``...) match only other added tokens with exactly the
  same content: ``special:<content>`` keys never collide with text.

Where several ids of one tokenizer decode to the same bytes (a normal token and a byte-fallback
token, say), the map uses the lowest-id normal token as the canonical one.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from edgespec import jsonio

SPIECE_SPACE = "\u2581"  # ▁
SPECIAL_PREFIX = b"special:"  # key prefix of added special tokens (``special:<content>``): never text


@lru_cache(maxsize=1)
def gpt2_byte_decoder() -> dict[str, int]:
    """Inverse of GPT-2's bytes_to_unicode table: printable char -> byte value."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def as_tokenizer(tok: Any):
    """A `tokenizers.Tokenizer` from a Tokenizer, a transformers fast tokenizer, a tokenizer.json path
    or a directory holding tokenizer.json."""
    if isinstance(tok, Tokenizer):
        return tok
    backend = getattr(tok, "backend_tokenizer", None)
    if backend is not None:
        return backend
    if isinstance(tok, (str, Path)):
        p = Path(tok)
        if p.is_dir():
            p = p / "tokenizer.json"
        return Tokenizer.from_file(str(p))
    raise TypeError(f"not a tokenizer: {type(tok).__name__}")


def vocab_hash(tokenizer: Any) -> str:
    """sha256 of the tokenizer's sorted (token, id) list, added tokens included.

    Serialised as compact JSON (`[["tok", id], ...]`, UTF-8, no ASCII escaping)."""
    return _vocab_digest(as_tokenizer(tokenizer).get_vocab(with_added_tokens=True))


def _vocab_digest(vocab: dict[str, int]) -> str:
    blob = json.dumps(sorted(vocab.items()), ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    return hashlib.sha256(blob).hexdigest()


def _component(tok, name: str) -> Any:
    """The JSON of one tokenizer component (pre_tokenizer, decoder, normalizer), or None; cheaper than
    serialising the whole tokenizer."""
    comp = getattr(tok, name, None)
    if comp is None:
        return None
    try:
        return json.loads(comp.__getstate__())
    except Exception:  # older tokenizers: fall back to the whole document
        return json.loads(tok.to_str()).get(name)


def _component_types(node: Any) -> set[str]:
    """All `type` values in a (possibly nested Sequence) tokenizer component."""
    out: set[str] = set()
    if isinstance(node, dict):
        if "type" in node:
            out.add(str(node["type"]))
        for v in node.values():
            out |= _component_types(v)
    elif isinstance(node, list):
        for v in node:
            out |= _component_types(v)
    return out


def tokenizer_style(tokenizer: Any) -> str:
    """'byte_level' (GPT-2 style), 'sentencepiece' (▁ + byte fallback) or 'plain'."""
    tok = as_tokenizer(tokenizer)
    pre = _component_types(_component(tok, "pre_tokenizer"))
    dec = _component_types(_component(tok, "decoder"))
    if "ByteLevel" in pre or ("ByteLevel" in dec and "Metaspace" not in pre):
        return "byte_level"
    if "Metaspace" in pre or "Metaspace" in dec or "ByteFallback" in dec or getattr(tok.model, "byte_fallback", False):
        return "sentencepiece"
    normalizer = json.dumps(_component(tok, "normalizer"), ensure_ascii=False)
    if SPIECE_SPACE in normalizer:
        return "sentencepiece"
    return "plain"


def _byte_fallback(token: str) -> int | None:
    if len(token) == 6 and token.startswith("<0x") and token.endswith(">"):
        try:
            return int(token[3:5], 16)
        except ValueError:
            return None
    return None


def token_bytes(token: str, style: str) -> bytes | None:
    """The bytes a (non-added) vocabulary token stands for, or None if it cannot be decoded."""
    if style == "byte_level":
        table = gpt2_byte_decoder()
        try:
            return bytes(table[c] for c in token)
        except KeyError:
            pass  # not a byte-level string: fall through to the SentencePiece rules
    b = _byte_fallback(token)
    if b is not None:
        return bytes([b])
    return token.replace(SPIECE_SPACE, " ").encode("utf-8")


@dataclass
class TokenTable:
    """Decoded keys of every id of one tokenizer."""
    style: str
    size: int                                   # max id + 1 (or the model's vocabulary size)
    keys: list[bytes | None]                    # per id; SPECIAL_PREFIX + content for added specials
    added: set[int] = field(default_factory=set)
    special: set[int] = field(default_factory=set)
    byte_fallback: set[int] = field(default_factory=set)

    def canonical(self) -> dict[bytes, int]:
        """key -> canonical id (lowest normal id; byte-fallback tokens only where nothing else has the key)."""
        out: dict[bytes, int] = {}
        for i, k in enumerate(self.keys):
            if k is None:
                continue
            j = out.get(k)
            if j is None or (j in self.byte_fallback and i not in self.byte_fallback):
                out[k] = i
        return out

    def text_keys(self) -> list[bytes | None]:
        """`keys` with the added special tokens as None: what each id spells in text."""
        return [None if k is None or k.startswith(SPECIAL_PREFIX) else k for k in self.keys]


def token_table(tokenizer: Any, size: int | None = None) -> TokenTable:
    tok = as_tokenizer(tokenizer)
    style = tokenizer_style(tok)
    vocab = tok.get_vocab(with_added_tokens=True)
    added_dec = tok.get_added_tokens_decoder()
    n = max(vocab.values()) + 1 if vocab else 0
    size = max(n, size or 0)
    keys: list[bytes | None] = [None] * size
    table = TokenTable(style=style, size=size, keys=keys)
    for token, i in vocab.items():
        if i in added_dec:
            at = added_dec[i]
            table.added.add(i)
            if getattr(at, "special", False):
                table.special.add(i)
            # A non-special added token that is plain text still decodes to its text.
            keys[i] = (SPECIAL_PREFIX + at.content.encode("utf-8")) if at.special else at.content.encode("utf-8")
            continue
        keys[i] = token_bytes(token, style)
        if _byte_fallback(token) is not None:
            table.byte_fallback.add(i)
    return table


def build_maps(target_tok: Any, drafter_tok: Any, target_size: int | None = None,
               drafter_size: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(drafter_to_target [V_d], target_to_drafter [V_t]) int64 arrays, -1 where a token has no counterpart.

    `target_size`/`drafter_size` are the models' vocabulary sizes (logit widths), which may exceed
    the tokenizers' (Qwen pads its embedding to 151,936); ids beyond a tokenizer map to -1."""
    t = token_table(target_tok, target_size)
    d = token_table(drafter_tok, drafter_size)
    t_canon = t.canonical()
    d_canon = d.canonical()
    d2t = np.full(d.size, -1, dtype=np.int64)
    t2d = np.full(t.size, -1, dtype=np.int64)
    for i, k in enumerate(d.keys):
        if k is not None:
            d2t[i] = t_canon.get(k, -1)
    for i, k in enumerate(t.keys):
        if k is not None:
            t2d[i] = d_canon.get(k, -1)
    return d2t, t2d


def intersection_size(d2t: np.ndarray) -> int:
    """Number of drafter ids with a target counterpart."""
    return int((np.asarray(d2t) >= 0).sum())


# --------------------------------------------------------------------------- special tokens

def _read_json(path: Path) -> dict:
    try:
        return jsonio.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def _ids(value: Any) -> list[int]:
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return [int(v) for v in value if v is not None]
    return [int(value)]


def _token_id(tok, value: Any) -> int | None:
    if isinstance(value, dict):  # AddedToken serialised as a dict
        value = value.get("content")
    if not isinstance(value, str):
        return None
    return tok.token_to_id(value)


@dataclass
class TokenizerInfo:
    bos_id: int | None
    eos_ids: list[int]
    pad_id: int | None
    unk_id: int | None
    add_bos: bool
    chat_template: str | None
    special_ids: list[int]        # added tokens marked special + bos/eos/pad/unk
    vocab_hash: str
    vocab_size: int               # tokenizer size (max id + 1)
    style: str

    def manifest(self) -> dict:
        return {"bos_id": self.bos_id, "eos_ids": self.eos_ids, "pad_id": self.pad_id, "unk_id": self.unk_id,
                "add_bos": self.add_bos, "vocab_hash": self.vocab_hash, "vocab_size": self.vocab_size,
                "style": self.style, "chat_template": self.chat_template is not None,
                "num_special": len(self.special_ids)}


def tokenizer_info(model_dir: str | Path, tokenizer: Any = None) -> TokenizerInfo:
    """Special tokens, BOS behaviour and chat template of an HF model/bundle directory.

    EOS ids: generation_config.json / config.json first (they are what generation uses), then
    tokenizer_config.json's eos_token unless it is the BOS (GGUF-converted tokenizer configs sometimes
    name the wrong one)."""
    d = Path(model_dir)
    tok = as_tokenizer(tokenizer if tokenizer is not None else d)
    tcfg = _read_json(d / "tokenizer_config.json")
    gcfg = _read_json(d / "generation_config.json")
    mcfg = _read_json(d / "config.json")
    eos: list[int] = []
    for src in (gcfg.get("eos_token_id"), mcfg.get("eos_token_id")):
        for i in _ids(src):
            if i not in eos:
                eos.append(i)
    tok_bos = bos = _token_id(tok, tcfg.get("bos_token"))
    if bos is None:
        bos = next(iter(_ids(gcfg.get("bos_token_id") or mcfg.get("bos_token_id"))), None)
    # The tokenizer's own eos_token too (Qwen: generation stops on <|im_end|>, text ends with
    # <|endoftext|>), unless the tokenizer config names the same token as its BOS (GGUF-converted
    # SmolLM2 names <|im_start|> as both).
    i = _token_id(tok, tcfg.get("eos_token"))
    if i is not None and i not in eos and (i != tok_bos or not eos):
        eos.append(i)
    pad = _token_id(tok, tcfg.get("pad_token"))
    if pad is None:
        pad = next(iter(_ids(gcfg.get("pad_token_id") if "pad_token_id" in gcfg else mcfg.get("pad_token_id"))), None)
    unk = _token_id(tok, tcfg.get("unk_token"))
    # add_bos = what encoding with special tokens actually does (the post-processor decides).
    ids = tok.encode("a", add_special_tokens=True).ids
    add_bos = bool(ids) and bos is not None and ids[0] == bos
    template = None
    if (d / "chat_template.jinja").is_file():
        template = (d / "chat_template.jinja").read_text(encoding="utf-8")
    elif isinstance(tcfg.get("chat_template"), str):
        template = tcfg["chat_template"]
    vocab = tok.get_vocab(with_added_tokens=True)
    size = max(vocab.values()) + 1 if vocab else 0
    special = {i for i, at in tok.get_added_tokens_decoder().items() if getattr(at, "special", False)}
    for i in [bos, pad, unk, *eos]:
        if i is not None and 0 <= i < size:
            special.add(i)
    digest = _vocab_digest(vocab)
    return TokenizerInfo(bos_id=bos, eos_ids=eos, pad_id=pad, unk_id=unk, add_bos=add_bos, chat_template=template,
                         special_ids=sorted(special), vocab_hash=digest, vocab_size=size,
                         style=tokenizer_style(tok))


def special_ids(model_dir: str | Path, tokenizer: Any = None) -> list[int]:
    """Ids always kept in a pruned head: added tokens marked special, BOS, EOS, pad and unk."""
    return tokenizer_info(model_dir, tokenizer).special_ids


# --------------------------------------------------------------------------- vocab.json (kept vocabulary)

VOCAB_FORMAT = "edgespec-vocab"
VOCAB_FORMAT_VERSION = 1


def read_vocab_file(path: str | Path, expected_hash: str | None, error: type[Exception]) -> dict:
    """Read and check a vocab.json written by `edgespec calibrate` (format: docs/architecture.md).

    Checks the format, version, that `kept_ids` is a non-empty list of ints, and, with
    `expected_hash`, that the file was made for the tokenizer whose `vocab_hash` that is.
    Failures raise `error` (the caller's EdgespecError subclass) with a one-line message."""
    path = Path(path)
    try:
        doc = jsonio.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise error(f"cannot read vocab file {path}: {exc.strerror}") from None
    except ValueError as exc:
        raise error(f"vocab file {path} is not valid JSON ({exc})") from None
    if not isinstance(doc, dict) or doc.get("format") != VOCAB_FORMAT:
        found = doc.get("format") if isinstance(doc, dict) else None
        raise error(f"{path} is not an edgespec vocab file (format {found!r})")
    if doc.get("format_version") != VOCAB_FORMAT_VERSION:
        raise error(f"{path}: unsupported vocab format_version {doc.get('format_version')!r} "
                    f"(expected {VOCAB_FORMAT_VERSION})")
    ids = doc.get("kept_ids")
    if not isinstance(ids, list) or not ids or not all(isinstance(i, int) for i in ids):
        raise error(f"vocab file {path}: kept_ids must be a non-empty list of token ids")
    if expected_hash is not None:
        have = (doc.get("tokenizer") or {}).get("vocab_hash")
        if have != expected_hash:
            raise error(f"vocab file {path} was made for another tokenizer (vocab_hash {str(have)[:12]}…, "
                        f"this tokenizer's is {expected_hash[:12]}…); recalibrate for this tokenizer")
    return doc
