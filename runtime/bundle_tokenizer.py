"""A bundle side's tokenizer.json, loaded and checked (torch-free): parsed once per distinct file,
its vocab hash remembered beside the file's digest (edgespec/hashing.py), and refused when it is a
known-wrong GGUF conversion (`stale_gguf_tokenizer`)."""
from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer
from tokenizers import __version__ as tokenizers_version

from edgespec.errors import BundleError
from edgespec.hashing import DigestMemory
from edgespec.runtime.vocab import vocab_hash

TOKENIZER_FIXED_IN = "0.1.1"


def load_tokenizer(root: Path, side: str, path: Path, memory: DigestMemory | None, loaded: dict):
    """(Tokenizer, its vocab_hash). With a digest memory (verify "full"/"fast": the file was hashed), a file
    whose digest was loaded already is not parsed again, and the vocab hash is remembered with the digest."""
    digest = memory.sha256(path) if memory is not None else None
    if digest is not None and digest in loaded:
        return loaded[digest]
    try:
        tok = Tokenizer.from_file(str(path))
    except Exception as exc:  # tokenizers raises plain Exception on a bad file
        raise BundleError(f"bundle {root}: {side}/tokenizer.json cannot be loaded "
                          f"({' '.join(str(exc).split())[:120]})") from exc
    stale = stale_gguf_tokenizer(tok)
    if stale:
        raise BundleError(f"bundle {root}: its {side} tokenizer is {stale}; re-export with edgespec >= "
                          f"{TOKENIZER_FIXED_IN}")
    have = (memory.derived(path, f"vocab_hash@tokenizers-{tokenizers_version}", lambda: vocab_hash(tok))
            if memory is not None else vocab_hash(tok))
    if digest is not None:
        loaded[digest] = (tok, have)
    return tok, have


def stale_gguf_tokenizer(tok) -> str | None:
    """Why `tok` is a known-wrong GGUF conversion (None if it is not): a Unigram model over Gemma's
    vocabulary (its turn markers and SentencePiece byte pieces). Gemma's real tokenizer is BPE with byte
    fallback, so only transformers' GGUF conversion (#41494) produces this combination."""
    if type(tok.model).__name__ != "Unigram":
        return None
    if all(tok.token_to_id(t) is not None for t in ("<start_of_turn>", "<end_of_turn>", "<0x00>", "<0xFF>")):
        return "the wrong Gemma tokenizer of transformers' GGUF conversion (Unigram instead of BPE)"
    return None
