"""The one file-hashing helper every part uses (torch-free)."""
from __future__ import annotations

import hashlib
from pathlib import Path

from tqdm import tqdm

_BLOCK = 1 << 22


def sha256_file(path: str | Path, progress: bool = False, desc: str | None = None) -> str:
    """sha256 hex digest of a file, read in 4 MiB blocks (optional tqdm progress bar)."""
    path = Path(path)
    h = hashlib.sha256()
    bar = None
    if progress:
        bar = tqdm(total=path.stat().st_size, desc=desc or f"sha256 {path.name}", unit="B", unit_scale=True, leave=False)
    with open(path, "rb") as f:
        while block := f.read(_BLOCK):
            h.update(block)
            if bar is not None:
                bar.update(len(block))
    if bar is not None:
        bar.close()
    return h.hexdigest()
