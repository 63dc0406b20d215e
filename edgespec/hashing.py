"""The one file-hashing helper every part uses (torch-free)."""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
import time
from pathlib import Path


from edgespec import jsonio
from edgespec.paths import cache_home

_BLOCK = 1 << 22


def sha256_file(path: str | Path, progress: bool = False, desc: str | None = None) -> str:
    """sha256 hex digest of a file, read in 4 MiB blocks (optional tqdm progress bar)."""
    path = Path(path)
    h = hashlib.sha256()
    bar = None
    if progress:
        from tqdm import tqdm    # lazy: an app's cold start never shows a bar

        bar = tqdm(total=path.stat().st_size, desc=desc or f"sha256 {path.name}", unit="B", unit_scale=True, leave=False)
    with open(path, "rb") as f:
        while block := f.read(_BLOCK):
            h.update(block)
            if bar is not None:
                bar.update(len(block))
    if bar is not None:
        bar.close()
    return h.hexdigest()


# ---------------------------------------------------------------- digests remembered by file identity
# A bundle's weights are gigabytes: hashing them at every `Bundle.load` costs seconds (10 s for the
# int4 Qwen pair). A digest is reused only while the file's identity and metadata are unchanged:
# device, inode, size, mtime and ctime (nanoseconds). A user process can set mtime but not ctime, which
# the kernel moves on every write or metadata change, so a file rewritten in place is hashed again.
DIGEST_CACHE = "digests.json"
_MAX_ENTRIES = 4096
NOTICE_BYTES = 512 * 1024**2     # a load that hashes more than this says so (DigestMemory.say_if_slow)
_SETTLED_NS = 2_000_000_000


def _identity(st: os.stat_result) -> list[int]:
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def _cache_file() -> Path:
    return cache_home() / DIGEST_CACHE


def _read_cache(path: Path) -> dict:
    try:
        doc = jsonio.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


class DigestMemory:
    """sha256 of files, reusing the digest recorded for the same file identity (see above). The record
    lives in <edgespec cache>/digests.json, read once and written once (`save`); an unreadable or
    unwritable record only means hashing again."""

    def __init__(self, path: Path | None = None):
        self.path = path or _cache_file()
        self.entries = _read_cache(self.path)       # what is saved: settled files only
        self.fresh: dict = {}                       # files hashed here but too recently written to save
        self.changed = False

    def _entry(self, file: Path) -> tuple[str, list[int], dict | None]:
        """(key, identity, the entry recorded for this very identity or None)."""
        key = str(file.resolve())
        ident = _identity(file.stat())
        entry = self.entries.get(key) or self.fresh.get(key)
        ok = isinstance(entry, dict) and entry.get("id") == ident and isinstance(entry.get("sha256"), str)
        return key, ident, entry if ok else None

    def remembers(self, file: str | Path) -> bool:
        """Whether the digest of the file as it is now is recorded (sha256 would not read it)."""
        return self._entry(Path(file))[2] is not None

    def say_if_slow(self, files, what: str = "files", reuse: bool = True) -> int:
        """One line on stderr where hashing `files` reads more than NOTICE_BYTES (not remembered here, with
        `reuse`; about 1 s per GB); returns those bytes."""
        todo = sum(Path(f).stat().st_size for f in files if not (reuse and self.remembers(f)))
        if todo > NOTICE_BYTES:
            print(f"edgespec: checking {todo / 1e9:.1f} GB of {what} (sha256), once per file on this machine",
                  file=sys.stderr, flush=True)
        return todo

    def sha256(self, file: str | Path, reuse: bool = True) -> str:
        """The file's digest: the remembered one for its identity (with `reuse`), else read and remembered
        (not if the file changed while it was read; an exception while reading remembers nothing)."""
        key, ident, entry = self._entry(Path(file))
        if entry is not None and reuse:
            return entry["sha256"]
        digest = sha256_file(file)
        if _identity(Path(file).stat()) != ident:     # changed while being read: remember nothing
            return digest
        # Saved only if not "racily clean" (as git says): the kernel's timestamps are coarse (a tick of a
        # few ms), so a write just after a recent one may not move ctime. Either way this load reuses it.
        if time.time_ns() - ident[4] > _SETTLED_NS:
            self.entries.pop(key, None)             # re-inserted last: the record keeps the most recent
            self.entries[key] = {"id": ident, "sha256": digest}
            self.changed = True
        else:
            self.fresh[key] = {"id": ident, "sha256": digest}
        return digest

    def derived(self, file: str | Path, name: str, compute):
        """compute() (a str or number that depends on the file's content alone), remembered beside the
        file's digest once the file has one here."""
        key, _, entry = self._entry(Path(file))
        if entry is None:
            return compute()
        if name not in entry:
            entry[name] = compute()
            self.changed = self.changed or key in self.entries
        return entry[name]

    def known(self, file: str | Path, name: str):
        """What derived(file, name, ...) remembered for the file as it is now, or None."""
        _, _, entry = self._entry(Path(file))
        return None if entry is None else entry.get(name)

    def save(self) -> None:
        if not self.changed:
            return
        entries = dict(list(self.entries.items())[-_MAX_ENTRIES:])     # the most recent ones
        with contextlib.suppress(OSError):
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_name(f".{DIGEST_CACHE}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps(entries), encoding="utf-8")
            os.replace(tmp, self.path)
        self.changed = False
