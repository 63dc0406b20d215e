"""Atomic, reproducible output of a calibration run.

Everything is first written into a hidden temporary directory next to VOCAB.json, then moved into
place: the priors directory, the coverage curve, and VOCAB.json last. An interrupted or failed run
removes the temporary directory, so it leaves no partial output (a hard kill can leave only the
hidden `.VOCAB.json.tmp-*` directory, never a VOCAB.json). .npz files are written with fixed zip
timestamps so that the same inputs give byte-identical files.
"""
from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import sys
import zipfile
from pathlib import Path

import numpy as np

from edgespec.errors import CalibrationError
from edgespec.hashing import sha256_file

ZIP_EPOCH = (1980, 1, 1, 0, 0, 0)


def output_paths(out: Path) -> dict[str, Path]:
    """VOCAB.json -> its priors dir and coverage files, all next to it."""
    stem = out.name[:-5] if out.name.endswith(".json") else out.name
    return {"vocab": out, "priors": out.parent / f"{stem}.priors",
            "curve_json": out.parent / f"{stem}.coverage.json", "curve_png": out.parent / f"{stem}.coverage.png"}


def save_npz(path: Path, **arrays: np.ndarray) -> None:
    """Like np.savez (loadable with allow_pickle=False), with deterministic bytes."""
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as zf:
        for name, arr in arrays.items():
            info = zipfile.ZipInfo(f"{name}.npy", date_time=ZIP_EPOCH)
            with zf.open(info, "w", force_zip64=True) as f:
                np.lib.format.write_array(f, np.asarray(arr), allow_pickle=False)


def dumps(doc, indent: int = 0) -> str:
    """Indented JSON with lists of numbers on one line (kept_ids, curves)."""
    pad, inner = " " * indent, " " * (indent + 1)
    if isinstance(doc, dict) and doc:
        items = [f"{inner}{json.dumps(str(k), ensure_ascii=False)}: {dumps(v, indent + 1)}" for k, v in doc.items()]
        return "{\n" + ",\n".join(items) + "\n" + pad + "}"
    if isinstance(doc, (list, tuple)) and doc and not all(isinstance(v, (int, float)) for v in doc):
        return "[\n" + ",\n".join(inner + dumps(v, indent + 1) for v in doc) + "\n" + pad + "]"
    return json.dumps(doc, ensure_ascii=False, separators=(",", ":"))


def write_json(path: Path, doc: dict) -> None:
    path.write_text(dumps(doc) + "\n", encoding="utf-8")


def versions() -> dict:
    """Versions of what produced the output (torch/transformers only when they were used)."""
    out = {"python": sys.version.split()[0]}
    for name in ("edgespec", "numpy", "tokenizers", "onnxruntime-gpu", "onnxruntime", "torch", "transformers"):
        module = {"onnxruntime-gpu": "onnxruntime", "edgespec": "edgespec"}.get(name, name)
        if name in ("torch", "transformers", "onnxruntime", "onnxruntime-gpu") and module not in sys.modules:
            continue
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return out


class AtomicOutput:
    """Context manager: `tmp` is a scratch directory; `commit()` moves the files into place."""

    def __init__(self, out: Path):
        self.paths = output_paths(Path(out))
        parent = self.paths["vocab"].parent
        if parent.exists() and not parent.is_dir():
            raise CalibrationError(f"--out {self.paths['vocab']}: {parent} is not a directory")
        try:
            parent.mkdir(parents=True, exist_ok=True)      # like `mkdir -p`: --out new/dir/vocab.json works
        except OSError as exc:
            raise CalibrationError(f"--out {self.paths['vocab']}: cannot create the directory {parent} "
                                   f"({exc.strerror or exc})") from None
        if self.paths["vocab"].is_dir():
            raise CalibrationError(f"--out {self.paths['vocab']} is a directory; give a file name like vocab.json")
        self.tmp = parent / f".{self.paths['vocab'].name}.tmp-{os.getpid()}"
        self.committed = False
        self.extra: dict[Path, Path] = {}      # more files to move into place at commit (tmp -> final)

    def __enter__(self) -> "AtomicOutput":
        if self.tmp.exists():
            shutil.rmtree(self.tmp)
        self.tmp.mkdir()
        (self.tmp / "priors").mkdir()
        return self

    @property
    def priors(self) -> Path:
        return self.tmp / "priors"

    def commit(self, vocab_doc: dict, curve_doc: dict | None, plot=None) -> None:
        if curve_doc is not None:
            write_json(self.tmp / "coverage.json", curve_doc)
            if plot is not None:
                try:
                    plot(curve_doc, self.tmp / "coverage.png")
                except ImportError:
                    print("edgespec: warning: matplotlib is not installed; no coverage PNG "
                          "(pip install 'edgespec[calibrate]')", file=sys.stderr)
        write_json(self.tmp / "vocab.json", vocab_doc)
        final = self.paths["priors"]
        old = final.with_name(final.name + f".old-{os.getpid()}")
        if final.exists():
            os.replace(final, old)
        os.replace(self.priors, final)
        if old.exists():
            shutil.rmtree(old, ignore_errors=True)
        for name, key in (("coverage.json", "curve_json"), ("coverage.png", "curve_png")):
            if (self.tmp / name).exists():
                os.replace(self.tmp / name, self.paths[key])
        for src, dst in self.extra.items():
            shutil.move(str(src), str(dst))          # may cross file systems
        os.replace(self.tmp / "vocab.json", self.paths["vocab"])     # last: the commit point
        self.committed = True

    def __exit__(self, exc_type, exc, tb) -> None:
        shutil.rmtree(self.tmp, ignore_errors=True)


def file_digests(directory: Path) -> dict[str, str]:
    return {p.name: sha256_file(p) for p in sorted(directory.iterdir()) if p.is_file()}
