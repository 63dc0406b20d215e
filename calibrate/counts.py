"""Streaming token counts (VocabTrim Algorithm 1) over raw text, and mapping counts between vocabularies.

Inputs are files, directories (walked recursively) or globs (`**` recursive), read in sorted order.
`.gz` files are decompressed; `.jsonl`/`.jsonl.gz` files yield one document per line from a field
(default "text"). A document is tokenised in chunks cut at line starts that begin with a non-space
character, so a chunk boundary never changes the pre-tokenisation of the text around it; memory is
bounded by the chunk batch (about 1M characters) and the count arrays. Chunks that continue a document
are encoded without a SentencePiece-style prefix space (which the whole text has only at its start).

Special tokens are counted as the model sees them: the tokenizer's own post-processor affixes (BOS for
Gemma-style tokenizers, nothing for Qwen) once per document, never per chunk.

Files that are binary (NUL bytes) or not UTF-8 are skipped with a warning and counted in the stats;
a file's counts are merged only once it has been read completely, so a file skipped half-way leaves
no partial counts behind.
"""
from __future__ import annotations

import glob
import gzip
import hashlib
import io
import json
import sys
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator

import numpy as np
from tqdm import tqdm

from edgespec.calibrate.jsonl import jsonl_records
from edgespec.errors import CalibrationError
from edgespec.hashing import sha256_file
from edgespec.runtime.bundle.reencode import ByteEncoder, continuation_tokenizer
from edgespec.runtime.bundle.vocab import token_table

CHUNK_CHARS = 1 << 16          # target size of one tokenised chunk
BATCH_CHARS = 1 << 20          # characters tokenised per encode_batch call
SNIFF_BYTES = 8192
GLOB_CHARS = set("*?[")


@dataclass
class CorpusStats:
    """What a raw-text pass read and skipped."""
    files: int = 0
    documents: int = 0
    chars: int = 0
    tokens: int = 0                       # tokens counted in the primary (drafter) vocabulary
    truncated: bool = False               # stopped at the --max-tokens budget
    skipped_binary: list[str] = field(default_factory=list)
    skipped_not_utf8: list[str] = field(default_factory=list)
    file_hashes: list[tuple[str, str]] = field(default_factory=list)

    @property
    def skipped(self) -> int:
        return len(self.skipped_binary) + len(self.skipped_not_utf8)

    def digest(self) -> str:
        """sha256 over the sorted (path, sha256 of bytes) list of the files read."""
        blob = json.dumps(sorted(self.file_hashes), separators=(",", ":")).encode("utf-8")
        return hashlib.sha256(blob).hexdigest()

    def summary(self) -> dict:
        return {"files": self.files, "documents": self.documents, "chars": self.chars, "tokens": self.tokens,
                "truncated": self.truncated, "skipped_binary": len(self.skipped_binary),
                "skipped_not_utf8": len(self.skipped_not_utf8), "files_sha256": self.digest()}


class SkipFile(Exception):
    """Raised inside a file's reader: the file is binary or not UTF-8."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


# --------------------------------------------------------------------------- inputs

def expand_inputs(specs: Iterable[str], option: str = "--data") -> list[Path]:
    """Files named by paths, directories and globs, de-duplicated, each spec sorted."""
    out: list[Path] = []
    seen: set[Path] = set()
    specs = list(specs)
    if not specs:
        raise CalibrationError(f"no {option} given: name files, directories or globs to count")
    for spec in specs:
        if any(c in GLOB_CHARS for c in spec):
            found = sorted(Path(p) for p in glob.glob(str(Path(spec).expanduser()), recursive=True))
            files = [p for p in found if p.is_file()]
            if not files:
                raise CalibrationError(f"{option} {spec!r}: the glob matches no files")
        else:
            p = Path(spec).expanduser()
            if p.is_dir():
                files = sorted(q for q in p.rglob("*") if q.is_file())
                if not files:
                    raise CalibrationError(f"{option} {spec!r}: the directory holds no files")
            elif p.is_file():
                files = [p]
            else:
                raise CalibrationError(f"{option} {spec!r}: no such file or directory")
        for f in files:
            r = f.resolve()
            if r not in seen:
                seen.add(r)
                out.append(f)
    return out


def is_jsonl(path: Path) -> bool:
    name = path.name.lower()
    return name.endswith(".jsonl") or name.endswith(".jsonl.gz")


def _open_binary(path: Path):
    return gzip.open(path, "rb") if path.name.lower().endswith(".gz") else open(path, "rb")


def _text_stream(path: Path) -> io.TextIOBase:
    """A strict UTF-8 text stream; raises SkipFile for binary content (NUL in the first 8 KB)."""
    raw = _open_binary(path)
    try:
        head = raw.peek(SNIFF_BYTES)[:SNIFF_BYTES] if hasattr(raw, "peek") else b""
    except (OSError, EOFError) as exc:
        raw.close()
        raise SkipFile(f"unreadable ({exc})") from None
    if b"\x00" in head:
        raw.close()
        raise SkipFile("binary")
    return io.TextIOWrapper(raw, encoding="utf-8", errors="strict", newline="")


def clean_cut(prev: str, line: str) -> bool:
    """Whether cutting between two lines keeps the pre-tokenisation (GPT-2 and Qwen regexes, Metaspace):
    `line` starts with a non-space character and `prev` ends with one newline after a non-space one
    (a longer whitespace run at the end of a chunk would be split differently from the whole text)."""
    return (bool(line[:1]) and not line[:1].isspace() and len(prev) >= 2 and prev[-1] == "\n"
            and not prev[-2].isspace())


def chunk_lines(lines: Iterable[str], chunk_chars: int | None = None) -> Iterator[str]:
    """Join lines into chunks of about `chunk_chars`, cut only where `clean_cut` holds; a chunk that
    finds no clean cut is cut at any line end once it reaches 8 x chunk_chars (bounded memory)."""
    chunk_chars = CHUNK_CHARS if chunk_chars is None else chunk_chars
    buf: list[str] = []
    size = 0
    for line in lines:
        if "\x00" in line:
            raise SkipFile("binary")
        if buf and (size >= chunk_chars and clean_cut(buf[-1], line) or size >= 8 * chunk_chars):
            yield "".join(buf)
            buf, size = [], 0
        buf.append(line)
        size += len(line)
    if buf:
        yield "".join(buf)


def iter_file_documents(path: Path, jsonl_field: str = "text") -> Iterator[Any]:
    """Documents of one file: for plain text one document, an iterator of chunks; for jsonl one per
    line, a 1-element list of the field's string, or a list of int token ids when the field holds one."""
    try:
        stream = _text_stream(path)
    except OSError as exc:
        raise SkipFile(f"unreadable ({exc})") from None
    try:
        if not is_jsonl(path):
            yield chunk_lines(stream)
            return
        for lineno, rec in jsonl_records(stream, path):
            value = rec.get(jsonl_field) if isinstance(rec, dict) else None
            if isinstance(value, str):
                yield [value]
            elif isinstance(value, list) and all(isinstance(v, int) for v in value):
                yield np.asarray(value, dtype=np.int64)
            else:
                raise CalibrationError(f"{path}:{lineno}: field {jsonl_field!r} is missing or not text")
    except UnicodeDecodeError:
        raise SkipFile("not UTF-8") from None
    except (EOFError, gzip.BadGzipFile, OSError) as exc:
        raise SkipFile(f"unreadable ({exc})") from None
    finally:
        stream.close()


# --------------------------------------------------------------------------- counting

def special_affixes(tokenizer) -> tuple[list[int], list[int]]:
    """(prefix, suffix) ids the tokenizer's post-processor adds around a single sequence."""
    plain = tokenizer.encode("x", add_special_tokens=False).ids
    full = tokenizer.encode("x", add_special_tokens=True).ids
    for i in range(len(full) - len(plain) + 1):
        if full[i:i + len(plain)] == plain:
            return list(full[:i]), list(full[i + len(plain):])
    return [], []


class TokenCounter:
    """Counts of one tokenizer's ids into an int64 array of the model's vocabulary size."""

    def __init__(self, tokenizer, size: int, name: str = "drafter"):
        self.tokenizer = tokenizer
        self.size = int(size)
        self.name = name
        self.counts = np.zeros(self.size, dtype=np.int64)
        self._file = np.zeros(self.size, dtype=np.int64)
        self.prefix, self.suffix = special_affixes(tokenizer)
        self.cont_tokenizer = continuation_tokenizer(tokenizer)

    def begin_file(self) -> None:
        self._file[:] = 0

    def commit_file(self) -> None:
        self.counts += self._file

    def add_ids(self, ids) -> int:
        ids = np.asarray(ids, dtype=np.int64)
        if ids.size == 0:
            return 0
        if ids.min() < 0 or ids.max() >= self.size:
            raise CalibrationError(f"token id {int(ids.max())} outside the {self.name} vocabulary ({self.size})")
        self._file += np.bincount(ids, minlength=self.size)
        return int(ids.size)

    def add_texts(self, texts: list[str], starts_document: bool = True) -> int:
        """Count chunks; the first starts a document only if `starts_document`, the others continue it."""
        n = 0
        heads, rest = (texts[:1], texts[1:]) if starts_document else ([], texts)
        for tok, part in ((self.tokenizer, heads), (self.cont_tokenizer, rest)):
            if part:
                for enc in tok.encode_batch(part, add_special_tokens=False):
                    n += self.add_ids(enc.ids)
        return n

    def add_document_affixes(self) -> int:
        return self.add_ids(self.prefix + self.suffix)


def count_corpus(paths: list[Path], counters: list[TokenCounter], jsonl_field: str = "text",
                 max_tokens: int | None = None, progress: bool = True) -> CorpusStats:
    """Stream `paths` through every counter (the first is the primary one for the token budget)."""
    stats = CorpusStats()
    primary = counters[0]
    bar = tqdm(total=len(paths), desc="counting", unit="file", disable=not progress, leave=False, mininterval=1.0)
    try:
        for path in paths:
            if max_tokens is not None and stats.tokens >= max_tokens:
                stats.truncated = True
                break
            for c in counters:
                c.begin_file()
            try:
                try:
                    n_docs, n_chars, n_tok = _count_file(path, counters, jsonl_field)
                except UnicodeDecodeError:
                    raise SkipFile("not UTF-8") from None
                except (EOFError, OSError, zlib.error) as exc:   # truncated/corrupt .gz, I/O errors
                    raise SkipFile(f"unreadable ({exc})") from None
            except SkipFile as skip:
                target = stats.skipped_not_utf8 if skip.reason == "not UTF-8" else stats.skipped_binary
                target.append(str(path))
                print(f"edgespec: warning: skipping {path}: {skip.reason}", file=sys.stderr)
                bar.update(1)
                continue
            for c in counters:
                c.commit_file()
            stats.files += 1
            stats.documents += n_docs
            stats.chars += n_chars
            stats.tokens += n_tok
            stats.file_hashes.append((str(path), sha256_file(path)))
            bar.update(1)
    finally:
        bar.close()
    if stats.skipped:
        print(f"edgespec: warning: skipped {stats.skipped} file(s) ({len(stats.skipped_binary)} binary, "
              f"{len(stats.skipped_not_utf8)} not UTF-8)", file=sys.stderr)
    if stats.tokens == 0 or int(primary.counts.sum()) == 0:
        raise CalibrationError(f"empty corpus: no tokens counted in {len(paths)} file(s)"
                               + (f" ({stats.skipped} skipped as binary/not UTF-8)" if stats.skipped else ""))
    return stats


def _count_file(path: Path, counters: list[TokenCounter], jsonl_field: str) -> tuple[int, int, int]:
    n_docs = n_chars = n_tok = 0
    for doc in iter_file_documents(path, jsonl_field):
        if isinstance(doc, np.ndarray):          # pre-tokenised ids: only the primary vocabulary
            n_tok += counters[0].add_ids(doc)
            n_docs += 1
            continue
        doc_chars = 0
        batch: list[str] = []
        size = 0
        for chunk in doc:
            batch.append(chunk)
            size += len(chunk)
            if size >= BATCH_CHARS:
                n_tok += _add_batch(batch, counters, doc_chars == 0)
                doc_chars += size
                batch, size = [], 0
        if batch:
            n_tok += _add_batch(batch, counters, doc_chars == 0)
            doc_chars += size
        if doc_chars:
            n_docs += 1
            n_chars += doc_chars
            n_tok += counters[0].add_document_affixes()
            for c in counters[1:]:
                c.add_document_affixes()
    return n_docs, n_chars, n_tok


def _add_batch(batch: list[str], counters: list[TokenCounter], starts_document: bool) -> int:
    n = counters[0].add_texts(batch, starts_document)
    for c in counters[1:]:
        c.add_texts(batch, starts_document)
    return n


# --------------------------------------------------------------------------- between vocabularies

@dataclass
class MappedCounts:
    counts: np.ndarray        # float64 [dst size]
    direct: float             # mass moved through the string map
    retokenised: float        # mass split over re-tokenised pieces
    unmapped: float           # mass with no counterpart at all (added tokens without a match)


def map_counts(src_counts: np.ndarray, src_to_dst: np.ndarray, src_tok, dst_tok, dst_size: int) -> MappedCounts:
    """Move counts from one vocabulary onto another (heterogeneous pairs).

    Tokens with a counterpart in the string map move their count to it. Others are decoded to their
    bytes and re-tokenised with the destination tokenizer (runtime/bundle/reencode.py, `ByteEncoder.retokenise`);
    their count is split equally over the resulting tokens (text that is not valid UTF-8 alone maps
    byte by byte onto the destination's single-byte tokens). Added tokens without an exact counterpart
    are reported as unmapped."""
    src_counts = np.asarray(src_counts, dtype=np.float64)
    out = np.zeros(int(dst_size), dtype=np.float64)
    n = min(src_counts.size, src_to_dst.size)
    mapped = (src_to_dst[:n] >= 0) & (src_counts[:n] > 0)
    idx = np.flatnonzero(mapped)
    np.add.at(out, src_to_dst[idx], src_counts[idx])
    direct = float(src_counts[idx].sum())
    rest = np.flatnonzero((src_counts[:n] > 0) & ~mapped)
    unmapped = float(src_counts[n:].sum())
    retok = 0.0
    if rest.size:
        s_keys = token_table(src_tok, src_counts.size).keys
        dst = ByteEncoder(dst_tok, dst_size)
        for i in rest:
            c = float(src_counts[i])
            key = s_keys[i] if i < len(s_keys) else None
            pieces = dst.retokenise(key) if key is not None else None
            if not pieces or max(pieces) >= dst_size:
                unmapped += c
                continue
            np.add.at(out, np.asarray(pieces, dtype=np.int64), c / len(pieces))
            retok += c
    return MappedCounts(out, direct, retok, unmapped)

