"""`Bundle.load(dir)`: a validated, loaded edgespec bundle (see docs/architecture.md). Torch-free.

verify="full" hashes every file against the manifest; "fast" skips hashing files larger than
64 MB (their sizes are still checked); "none" checks only that the files exist. Any problem raises
BundleError with a one-line message. Nothing here unpickles: .npy files load with
allow_pickle=False, and the optional affinity matrix is plain CSR arrays in an .npz.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from edgespec.errors import BundleError
from edgespec.hashing import sha256_file
from edgespec.runtime.manifest import SIDES, check_io, check_required_files, read_manifest

FAST_HASH_LIMIT = 64 * 1024**2
VERIFY_MODES = ("full", "fast", "none")


@dataclass
class CSR:
    """A sparse matrix as plain CSR arrays (no scipy in the runtime)."""
    data: np.ndarray
    indices: np.ndarray
    indptr: np.ndarray
    shape: tuple[int, int]

    def row(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """(column indices, values) of row i."""
        a, b = int(self.indptr[i]), int(self.indptr[i + 1])
        return self.indices[a:b], self.data[a:b]

    def to_dense(self) -> np.ndarray:
        out = np.zeros(self.shape, dtype=self.data.dtype)
        for i in range(self.shape[0]):
            cols, vals = self.row(i)
            out[i, cols] = vals
        return out


@dataclass
class ModelFiles:
    """One side (target or drafter) of a bundle."""
    dir: Path
    onnx: Path
    info: dict                       # the manifest's target/drafter entry
    tokenizer: Any                   # tokenizers.Tokenizer
    chat_template: str | None
    io: dict = field(default_factory=dict)

    @property
    def bos_id(self) -> int | None:
        return self.info["tokenizer"].get("bos_id")

    @property
    def eos_ids(self) -> list[int]:
        return list(self.info["tokenizer"].get("eos_ids") or [])

    @property
    def pad_id(self) -> int | None:
        return self.info["tokenizer"].get("pad_id")

    @property
    def add_bos(self) -> bool:
        return bool(self.info["tokenizer"].get("add_bos"))

    @property
    def vocab_size(self) -> int:
        return int(self.info["vocab_size"])


@dataclass
class Bundle:
    path: Path
    manifest: dict
    target: ModelFiles
    drafter: ModelFiles
    index_map: np.ndarray            # int64 [K]: kept column -> target id, -1 if none
    draft_ids: np.ndarray            # int64 [K]: kept column -> drafter id
    drafter_to_target: np.ndarray    # int64 [V_d]
    target_to_drafter: np.ndarray    # int64 [V_t]
    vocab: dict                      # the kept-vocabulary document (vocab/vocab.json)
    prior: np.ndarray | None = None          # float32 [V_t]
    affinity: CSR | None = None              # M
    affinity_info: dict | None = None
    randomised: dict | None = None           # {"a_star": ..., "lambda": ...}

    # ------------------------------------------------------------------ convenience
    @property
    def same_tokenizer(self) -> bool:
        return bool(self.manifest.get("same_tokenizer"))

    @property
    def kept(self) -> int:
        return int(self.index_map.shape[0])

    @property
    def a_star(self) -> float | None:
        return None if self.randomised is None else self.randomised.get("a_star")

    @property
    def target_info(self) -> dict:
        return self.manifest["target"]

    @property
    def drafter_info(self) -> dict:
        return self.manifest["drafter"]

    @property
    def target_tokenizer(self):
        return self.target.tokenizer

    @property
    def drafter_tokenizer(self):
        return self.drafter.tokenizer

    @property
    def chat_template(self) -> str | None:
        return self.target.chat_template

    def __repr__(self) -> str:
        return (f"Bundle({str(self.path)!r}, pair={self.manifest.get('pair')!r}, kept={self.kept}, "
                f"same_tokenizer={self.same_tokenizer})")

    # ------------------------------------------------------------------ loading
    @classmethod
    def load(cls, path: str | Path, verify: str = "full") -> "Bundle":
        if verify not in VERIFY_MODES:
            raise BundleError(f"verify must be one of {', '.join(VERIFY_MODES)}, got {verify!r}")
        root = Path(path).expanduser()
        if not root.is_dir():
            raise BundleError(f"bundle {root} does not exist or is not a directory")
        manifest = read_manifest(root)
        verify_files(root, manifest, verify)
        sides = {}
        for side in SIDES:
            sides[side] = _load_side(root, manifest, side)
        vdir = root / "vocab"
        index_map = _load_npy(root, vdir / "index_map.npy", np.int64)
        draft_ids = _load_npy(root, vdir / "draft_ids.npy", np.int64)
        d2t = _load_npy(root, vdir / "drafter_to_target.npy", np.int64)
        t2d = _load_npy(root, vdir / "target_to_drafter.npy", np.int64)
        k = int(manifest["vocab"]["kept"])
        if index_map.shape != (k,) or draft_ids.shape != (k,):
            raise BundleError(f"bundle {root}: index_map/draft_ids have shapes {index_map.shape}/{draft_ids.shape}, "
                              f"manifest says K={k}")
        v_t, v_d = int(manifest["target"]["vocab_size"]), int(manifest["drafter"]["vocab_size"])
        if d2t.shape != (v_d,) or t2d.shape != (v_t,):
            raise BundleError(f"bundle {root}: vocabulary maps have shapes {d2t.shape}/{t2d.shape}, expected ({v_d},)/({v_t},)")
        if draft_ids.size and (draft_ids.min() < 0 or draft_ids.max() >= v_d):
            raise BundleError(f"bundle {root}: draft_ids out of the drafter vocabulary")
        if index_map.size and index_map.max() >= v_t:
            raise BundleError(f"bundle {root}: index_map points outside the target vocabulary")
        vocab_doc = {}
        if (vdir / "vocab.json").is_file():
            vocab_doc = _load_json(root, vdir / "vocab.json")
        b = cls(path=root, manifest=manifest, target=sides["target"], drafter=sides["drafter"],
                index_map=index_map, draft_ids=draft_ids, drafter_to_target=d2t, target_to_drafter=t2d,
                vocab=vocab_doc)
        v = manifest["vocab"]
        if v.get("prior"):
            b.prior = _load_npy(root, root / v["prior"], np.float32)
            if b.prior.shape != (v_t,):
                raise BundleError(f"bundle {root}: prior has shape {b.prior.shape}, expected ({v_t},)")
        if v.get("affinity"):
            info = v["affinity"] if isinstance(v["affinity"], dict) else {"path": v["affinity"]}
            b.affinity = _load_csr(root, root / info["path"])
            b.affinity_info = info
        if v.get("randomised"):
            rnd = v["randomised"]
            if isinstance(rnd, str):
                rnd = _load_json(root, root / rnd)
            b.randomised = rnd
        return b


def verify_files(root: Path, manifest: dict, verify: str = "full") -> None:
    """Every listed file exists; unless verify="none", its size matches and (in "fast" mode only up to
    FAST_HASH_LIMIT bytes) so does its sha256."""
    check_required_files(root, manifest)
    files = manifest["files"]
    for rel, meta in files.items():
        p = root / rel
        if ".." in Path(rel).parts or Path(rel).is_absolute():
            raise BundleError(f"bundle {root}: bad file path in manifest: {rel}")
        if not p.is_file():
            raise BundleError(f"bundle {root}: missing file {rel}")
        if verify == "none":
            continue
        size = p.stat().st_size
        if size != int(meta["bytes"]):
            raise BundleError(f"bundle {root}: {rel} is corrupt (size {size}, manifest says {meta['bytes']})")
        if verify == "fast" and size > FAST_HASH_LIMIT:
            continue
        if sha256_file(p) != meta["sha256"]:
            raise BundleError(f"bundle {root}: {rel} is corrupt (sha256 mismatch)")


def _load_side(root: Path, manifest: dict, side: str) -> ModelFiles:
    info = manifest[side]
    d = root / side
    onnx_path = root / info.get("onnx", f"{side}/model.onnx")
    if not onnx_path.is_file():
        raise BundleError(f"bundle {root}: missing {side} graph {onnx_path.relative_to(root)}")
    io = info.get("io") or {}
    check_io(root, side, io)
    try:
        tok = Tokenizer.from_file(str(d / "tokenizer.json"))
    except Exception as exc:  # tokenizers raises plain Exception on a bad file
        raise BundleError(f"bundle {root}: {side}/tokenizer.json cannot be loaded ({str(exc)[:120]})") from exc
    tpl = None
    if (d / "chat_template.jinja").is_file():
        tpl = (d / "chat_template.jinja").read_text(encoding="utf-8")
    return ModelFiles(dir=d, onnx=onnx_path, info=info, tokenizer=tok, chat_template=tpl, io=io)


def _load_npy(root: Path, path: Path, dtype) -> np.ndarray:
    if not path.is_file():
        raise BundleError(f"bundle {root}: missing file {path.relative_to(root)}")
    try:
        arr = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise BundleError(f"bundle {root}: {path.relative_to(root)} is corrupt ({exc})") from exc
    if arr.dtype != np.dtype(dtype):
        raise BundleError(f"bundle {root}: {path.relative_to(root)} has dtype {arr.dtype}, expected {np.dtype(dtype)}")
    return arr


def _load_json(root: Path, path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise BundleError(f"bundle {root}: {path.relative_to(root)} is unreadable ({exc})") from exc


def _load_csr(root: Path, path: Path) -> CSR:
    if not path.is_file():
        raise BundleError(f"bundle {root}: missing file {path.relative_to(root)}")
    try:
        with np.load(path, allow_pickle=False) as z:
            data, indices, indptr, shape = z["data"], z["indices"], z["indptr"], z["shape"]
    except (OSError, ValueError, KeyError) as exc:
        raise BundleError(f"bundle {root}: {path.relative_to(root)} is not a CSR .npz ({exc})") from exc
    shape = (int(shape[0]), int(shape[1]))
    if indptr.shape != (shape[0] + 1,) or indices.shape != data.shape:
        raise BundleError(f"bundle {root}: {path.relative_to(root)} has inconsistent CSR arrays")
    return CSR(data=data, indices=indices, indptr=indptr.astype(np.int64, copy=False), shape=shape)
