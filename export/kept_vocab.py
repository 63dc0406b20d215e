"""The drafter's kept vocabulary for an export: a calibrated vocab.json (from `edgespec calibrate`)
or the plain first-K fallback. Special tokens are always kept."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edgespec.errors import ExportError
from edgespec.runtime.bundle.vocab import VOCAB_FORMAT, VOCAB_FORMAT_VERSION, read_vocab_file


@dataclass
class KeptVocab:
    ids: np.ndarray         # sorted drafter ids, int64
    provenance: dict
    doc: dict               # the vocab.json document written into the bundle
    priors_dir: Path | None


def first_k(k: int, vocab_size: int, specials: list[int]) -> np.ndarray:
    specials = sorted({int(s) for s in specials if 0 <= s < vocab_size})
    if len(specials) > k:
        raise ExportError(f"--keep {k} is smaller than the {len(specials)} special tokens that are always kept")
    kept = set(specials)
    i = 0
    while len(kept) < k and i < vocab_size:
        kept.add(i)
        i += 1
    return np.array(sorted(kept), dtype=np.int64)


def validate_keep(k: int | None, vocab_size: int | None = None) -> None:
    if k is None:
        return
    if k <= 0:
        raise ExportError(f"--keep must be a positive number of drafter tokens, got {k}")
    if vocab_size is not None and k > vocab_size:
        raise ExportError(f"--keep {k} is larger than the drafter vocabulary ({vocab_size})")


def load_vocab_file(path: Path, drafter_hash: str, vocab_size: int, specials: list[int]) -> KeptVocab:
    path = Path(path)
    doc = read_vocab_file(path, drafter_hash, ExportError)
    ids = doc["kept_ids"]
    arr = np.array(sorted(set(ids)), dtype=np.int64)
    if arr[0] < 0 or arr[-1] >= vocab_size:
        raise ExportError(f"vocab file {path}: kept id {int(arr[-1] if arr[-1] >= vocab_size else arr[0])} "
                          f"outside the drafter vocabulary (0..{vocab_size - 1})")
    missing = sorted(set(s for s in specials if 0 <= s < vocab_size) - set(arr.tolist()))
    if missing:  # special tokens are always kept
        arr = np.array(sorted(set(arr.tolist()) | set(missing)), dtype=np.int64)
    prov = dict(doc.get("provenance") or {})
    prov.setdefault("policy", "calibrated")
    prov["vocab_file"] = str(path)
    if missing:
        prov["specials_added"] = len(missing)
    priors = None
    if doc.get("priors_dir"):
        priors = (path.parent / doc["priors_dir"]).resolve()
        if not priors.is_dir():
            raise ExportError(f"vocab file {path}: priors_dir {doc['priors_dir']!r} does not exist")
    doc = dict(doc, kept_ids=arr.tolist())
    return KeptVocab(arr, prov, doc, priors)


def make_first_k(k: int, drafter_hash: str, vocab_size: int, specials: list[int]) -> KeptVocab:
    ids = first_k(k, vocab_size, specials)
    prov = {"policy": "first-k", "k": k, "specials_kept": len(specials),
            "note": "no calibration data: plain first-K fallback (the lowest K drafter ids, special tokens always kept)"}
    doc = {"format": VOCAB_FORMAT, "format_version": VOCAB_FORMAT_VERSION,
           "tokenizer": {"vocab_hash": drafter_hash, "vocab_size": vocab_size},
           "kept_ids": ids.tolist(), "provenance": prov, "priors_dir": None}
    return KeptVocab(ids, prov, doc, None)

