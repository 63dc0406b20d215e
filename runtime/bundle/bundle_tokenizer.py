"""A bundle side's tokenizer.json, loaded and checked (torch-free): parsed once per distinct file,
its vocab hash remembered beside the file's digest (edgespec/hashing.py), and refused when it is a
known-wrong GGUF conversion (`stale_gguf_tokenizer`).

A file whose digest and vocab hash were remembered by an earlier load (so it parsed, and passed these
checks, with this tokenizers version) is parsed on first use instead of at load (`TokenizerFile`):
the decoder parses it while ORT builds the target's session (sessions.create_sessions `beside`),
which takes the parse (about 0.3 s for Qwen's 151k-token vocabulary) off an app's cold start."""
from __future__ import annotations

import threading
from pathlib import Path

from tokenizers import Tokenizer
from tokenizers import __version__ as tokenizers_version

from edgespec.errors import BundleError
from edgespec.hashing import DigestMemory
from edgespec.runtime.bundle.vocab import vocab_hash

TOKENIZER_FIXED_IN = "0.1.1"


class TokenizerFile:
    """One tokenizer.json, parsed once: at load, or on first use (`get`) where an earlier load remembered
    that this very file parses and passes the checks. Thread-safe."""

    def __init__(self, root: Path, side: str, path: Path, tokenizer=None):
        self.root, self.side, self.path = root, side, path
        self._tokenizer = tokenizer
        self._lock = threading.Lock()

    @property
    def parsed(self) -> bool:
        return self._tokenizer is not None

    def get(self):
        """The tokenizers.Tokenizer (BundleError if the file no longer parses or is a stale conversion)."""
        if self._tokenizer is None:
            with self._lock:
                if self._tokenizer is None:
                    self._tokenizer = _parse(self.root, self.side, self.path)
        return self._tokenizer


def _parse(root: Path, side: str, path: Path):
    try:
        tok = Tokenizer.from_file(str(path))
    except Exception as exc:  # tokenizers raises plain Exception on a bad file
        raise BundleError(f"bundle {root}: {side}/tokenizer.json cannot be loaded "
                          f"({' '.join(str(exc).split())[:120]})") from exc
    stale = stale_gguf_tokenizer(tok)
    if stale:
        raise BundleError(f"bundle {root}: its {side} tokenizer is {stale}; re-export with edgespec >= "
                          f"{TOKENIZER_FIXED_IN}")
    return tok


def load_tokenizer(root: Path, side: str, path: Path, memory: DigestMemory | None,
                   loaded: dict) -> tuple[TokenizerFile, str]:
    """(TokenizerFile, its vocab_hash). With a digest memory (verify "full"/"fast": the file was hashed), a
    file whose digest was loaded already is not parsed again, the vocab hash is remembered with the digest,
    and a file whose vocab hash was remembered is parsed on first use."""
    digest = memory.sha256(path) if memory is not None else None
    if digest is not None and digest in loaded:
        return loaded[digest]
    key = f"vocab_hash@tokenizers-{tokenizers_version}"      # remembered only for a file that passed _parse
    have = memory.known(path, key) if memory is not None else None
    if isinstance(have, str):
        file = TokenizerFile(root, side, path)
    else:
        tok = _parse(root, side, path)
        file = TokenizerFile(root, side, path, tok)
        have = memory.derived(path, key, lambda: vocab_hash(tok)) if memory is not None else vocab_hash(tok)
    if digest is not None:
        loaded[digest] = (file, have)
    return file, have


def stale_gguf_tokenizer(tok) -> str | None:
    """Why `tok` is a known-wrong GGUF conversion (None if it is not): a Unigram model over Gemma's
    vocabulary (its turn markers and SentencePiece byte pieces). Gemma's real tokenizer is BPE with byte
    fallback, so only transformers' GGUF conversion (#41494) produces this combination."""
    if type(tok.model).__name__ != "Unigram":
        return None
    if all(tok.token_to_id(t) is not None for t in ("<start_of_turn>", "<end_of_turn>", "<0x00>", "<0xFF>")):
        return "the wrong Gemma tokenizer of transformers' GGUF conversion (Unigram instead of BPE)"
    return None
