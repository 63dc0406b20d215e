"""`Bundle.load(dir)`: a validated, loaded edgespec bundle (see docs/architecture.md). Torch-free.

Checks, by `verify` mode (`Bundle.load` and the commands' `--verify` default to "fast"):
- "fast": every file listed in the manifest's `files` exists, has the listed size and sha256. A digest
  is remembered per file identity (device, inode, size, mtime, ctime: edgespec/hashing.py), so a second
  load of an unchanged bundle reads no weights, while any write to a file (same size and mtime
  included: ctime moves) makes it hashed again. An interrupted hash is never remembered.
- "full": the same, every file read again whatever is remembered (for media that may rot under
  unchanged metadata); the digests found are remembered.
- "none": the listed files exist (nothing is hashed or size-checked).
In every mode: the manifest's values have the types the runtime needs (runtime/bundle/manifest.py); every
path the manifest names (`target.onnx`, `drafter.onnx`, `vocab.vocab_file`, `vocab.prior`,
`vocab.affinity`, `vocab.randomised`, and the fixed tokenizer / vocabulary-map paths) must be a
relative path listed in `files` that resolves, symlinks followed, to a file inside the bundle; no
symlink in the bundle may point outside it; and each side's tokenizer must have the `vocab_hash`
the manifest records (the hash export computed), and must not be a known-wrong GGUF conversion
(`stale_gguf_tokenizer`: Gemma's tokenizer as transformers 4.57 converted it; "re-export with edgespec
>= TOKENIZER_FIXED_IN"); a tokenizer.json that passed these checks on this machine before, unchanged
since (its digest memory), is parsed on first use instead. Any problem raises BundleError with a one-line
message. Nothing here unpickles: .npy files load with allow_pickle=False, and the optional affinity
matrix is plain CSR arrays in an .npz.
"""
from __future__ import annotations

import os
import zipfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

import numpy as np

from edgespec import jsonio
from edgespec.errors import BundleError, GenerationError
from edgespec.hashing import DigestMemory
from edgespec.runtime.bundle.bundle_tokenizer import (TOKENIZER_FIXED_IN, TokenizerFile, load_tokenizer,  # noqa: F401
                                               stale_gguf_tokenizer)
from edgespec.runtime.bundle.manifest import SIDES, check_io, check_required_files, is_target_only, read_manifest, shown
from edgespec.runtime.samplers.rdk import Affinity

VERIFY_MODES = ("full", "fast", "none")
DEFAULT_VERIFY = "fast"      # Bundle.load's and the commands' --verify: every byte hashed once per file identity
# Bundles exported before edgespec's own GGUF tokenizer converter (models/gguf_tokenizer.py) carry
# transformers 4.57's conversion of Gemma's GGUF tokenizer: a Unigram model over what is a
# SentencePiece BPE vocabulary, which tokenizes differently from the model's own tokenizer
# (" the" -> "▁t he"). Those are refused; this is the first version with the fix.


@dataclass
class ModelFiles:
    """One side (target or drafter) of a bundle."""
    dir: Path
    onnx: Path
    info: dict                       # the manifest's target/drafter entry
    tokenizer_file: TokenizerFile    # parsed at load, or on first use (bundle_tokenizer.py)
    chat_template: str | None
    io: dict = field(default_factory=dict)
    prefill_onnx: Path | None = None  # the target's fp32-compute prefill graph (export/prefill_graph.py), if any
    padded_onnx: Path | None = None   # the target's padded-attention graph (export/padded_attention.py), if any
    padded_exact_at_export: bool = False   # its export-time check found it exact (on the exporting machine)

    @property
    def runtime_onnx(self) -> Path:
        """The graph the runtime runs where no device profile says otherwise (runtime/planning/plan.py): the
        padded-attention graph where the export found it exact (model.onnx stays the builder's graph,
        for onnxruntime-genai)."""
        return self.padded_onnx if self.padded_onnx is not None and self.padded_exact_at_export else self.onnx

    @property
    def tokenizer(self):
        """The side's tokenizers.Tokenizer."""
        return self.tokenizer_file.get()

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

    @property
    def max_position(self) -> int | None:
        """The graph's context length (None: not recorded)."""
        return int(self.info.get("max_position") or 0) or None


@dataclass
class Bundle:
    path: Path
    manifest: dict
    target: ModelFiles
    drafter: ModelFiles | None       # None in a target-only bundle (`ar`, `ngram`)
    index_map: np.ndarray            # int64 [K]: kept column -> target id, -1 if none
    draft_ids: np.ndarray            # int64 [K]: kept column -> drafter id
    drafter_to_target: np.ndarray    # int64 [V_d]
    target_to_drafter: np.ndarray    # int64 [V_t]
    vocab: dict                      # the kept-vocabulary document (vocab/vocab.json)
    prior: np.ndarray | None = None          # float32 [V_t]
    affinity: Affinity | None = None         # M (rdk.py)
    affinity_info: dict | None = None
    randomised: dict | None = None           # {"a_star": ..., "lambda": ...}

    # ------------------------------------------------------------------ convenience
    @property
    def same_tokenizer(self) -> bool:
        return bool(self.manifest.get("same_tokenizer"))

    @property
    def has_drafter(self) -> bool:
        return self.drafter is not None

    @property
    def kept(self) -> int:
        return int(self.index_map.shape[0])

    @property
    def a_star(self) -> float | None:
        return None if self.randomised is None else self.randomised.get("a_star")

    @property
    def chat_template(self) -> str | None:
        return self.target.chat_template

    def require_chat_template(self) -> str:
        """The chat template, or a one-line GenerationError naming the bundle (a GGUF without
        tokenizer.chat_template, e.g. a base model: plain prompts still work)."""
        if not self.target.chat_template:
            raise GenerationError(f"bundle {self.path} has no chat template (its model came without one): "
                                  "chat mode is off for it; use a plain prompt")
        return self.target.chat_template

    def __repr__(self) -> str:
        if self.drafter is None:
            return f"Bundle({str(self.path)!r}, target only)"
        return (f"Bundle({str(self.path)!r}, pair={self.manifest.get('pair')!r}, kept={self.kept}, "
                f"same_tokenizer={self.same_tokenizer})")

    # ------------------------------------------------------------------ loading
    @classmethod
    def load(cls, path: str | Path, verify: str = DEFAULT_VERIFY) -> "Bundle":
        if verify not in VERIFY_MODES:
            raise BundleError(f"verify must be one of {', '.join(VERIFY_MODES)}, got {verify!r}")
        root = Path(path).expanduser()
        if not root.is_dir():
            raise BundleError(f"bundle {root} does not exist or is not a directory")
        manifest = read_manifest(root)
        memory = verify_files(root, manifest, verify)
        tokenizers: dict = {}       # tokenizer.json digest -> (Tokenizer, vocab_hash): a pair's shared file loads once
        if is_target_only(manifest):
            none = np.zeros(0, dtype=np.int64)
            target = _load_side(root, manifest, "target", memory, tokenizers)
            if memory is not None:
                memory.save()
            return cls(path=root, manifest=manifest, target=target, drafter=None,
                       index_map=none, draft_ids=none, drafter_to_target=none, target_to_drafter=none, vocab={})
        sides = {side: _load_side(root, manifest, side, memory, tokenizers) for side in SIDES}
        if memory is not None:
            memory.save()
        same = sides["target"].info["tokenizer"]["vocab_hash"] == sides["drafter"].info["tokenizer"]["vocab_hash"]
        if manifest["same_tokenizer"] != same:
            raise BundleError(f"bundle {root}: manifest says same_tokenizer={manifest['same_tokenizer']}, but the "
                              f"tokenizers' vocab_hash values {'agree' if same else 'differ'}")

        def npy(name: str) -> np.ndarray:
            return _load_npy(root, bundle_file(root, manifest, f"vocab/{name}.npy", f"vocab {name}"), np.int64)

        index_map, draft_ids = npy("index_map"), npy("draft_ids")
        d2t, t2d = npy("drafter_to_target"), npy("target_to_drafter")
        k = manifest["vocab"]["kept"]
        if index_map.shape != (k,) or draft_ids.shape != (k,):
            raise BundleError(f"bundle {root}: index_map/draft_ids have shapes {index_map.shape}/{draft_ids.shape}, "
                              f"manifest says K={k}")
        v_t, v_d = manifest["target"]["vocab_size"], manifest["drafter"]["vocab_size"]
        if d2t.shape != (v_d,) or t2d.shape != (v_t,):
            raise BundleError(f"bundle {root}: vocabulary maps have shapes {d2t.shape}/{t2d.shape}, expected ({v_d},)/({v_t},)")
        if draft_ids.size and (draft_ids.min() < 0 or draft_ids.max() >= v_d):
            raise BundleError(f"bundle {root}: draft_ids out of the drafter vocabulary")
        if index_map.size and (index_map.min() < -1 or index_map.max() >= v_t):
            raise BundleError(f"bundle {root}: index_map points outside the target vocabulary")
        if (d2t.size and (d2t.min() < -1 or d2t.max() >= v_t)) or (t2d.size and (t2d.min() < -1 or t2d.max() >= v_d)):
            raise BundleError(f"bundle {root}: a vocabulary map points outside the other vocabulary")
        v = manifest["vocab"]
        vocab_doc = {}
        vpath = optional_file(root, manifest, v.get("vocab_file") or "vocab/vocab.json", "vocab.vocab_file",
                              named=v.get("vocab_file") is not None)
        if vpath is not None:
            vocab_doc = _load_json(root, vpath)
            if not isinstance(vocab_doc, dict):
                raise BundleError(f"bundle {root}: {vpath.relative_to(root)} is not a JSON object")
        b = cls(path=root, manifest=manifest, target=sides["target"], drafter=sides["drafter"],
                index_map=index_map, draft_ids=draft_ids, drafter_to_target=d2t, target_to_drafter=t2d,
                vocab=vocab_doc)
        if v.get("prior"):
            b.prior = _load_npy(root, bundle_file(root, manifest, v["prior"], "vocab.prior"), np.float32)
            if b.prior.shape != (v_t,):
                raise BundleError(f"bundle {root}: prior has shape {b.prior.shape}, expected ({v_t},)")
            if not (np.isfinite(b.prior).all() and (b.prior >= 0).all() and b.prior.sum(dtype=np.float64) > 0):
                raise BundleError(f"bundle {root}: prior has negative, non-finite or all-zero values")
        if v.get("affinity"):
            info = v["affinity"] if isinstance(v["affinity"], dict) else {"path": v["affinity"]}
            b.affinity = _load_csr(root, bundle_file(root, manifest, info["path"], "vocab.affinity.path"))
            b.affinity_info = info
        if v.get("randomised"):
            rnd = v["randomised"]
            if isinstance(rnd, str):
                rnd = _load_json(root, bundle_file(root, manifest, rnd, "vocab.randomised"))
            a = rnd.get("a_star") if isinstance(rnd, dict) else None
            if not isinstance(rnd, dict) or not (a is None or (isinstance(a, (int, float)) and not isinstance(a, bool)
                                                               and 0.0 < a <= 1.0)):
                raise BundleError(f"bundle {root}: vocab.randomised must be an object whose a_star is in (0, 1] "
                                  f"or null, got {shown(rnd)}")
            b.randomised = rnd
        return b


def _escapes(rel: str) -> bool:
    """An absolute path, a Windows-style one, or one with a `..` component."""
    p = PurePosixPath(rel)
    return p.is_absolute() or Path(rel).is_absolute() or "\\" in rel or ".." in p.parts


def _resolve(root: Path, p: Path) -> Path:
    """p.resolve(), a symlink loop (RuntimeError before Python 3.13, OSError after) being a BundleError."""
    try:
        return p.resolve()
    except (OSError, RuntimeError) as exc:
        raise BundleError(f"bundle {root}: {shown(str(p))} cannot be resolved ({' '.join(str(exc).split())[:100]})") \
            from exc


def _inside(root: Path, rel: str) -> Path:
    """ROOT/REL, checked to resolve (symlinks followed) to a path inside the bundle."""
    p = root / rel
    real, base = _resolve(root, p), _resolve(root, root)
    if not real.is_relative_to(base):
        raise BundleError(f"bundle {root}: {shown(rel)} resolves outside the bundle (to {shown(str(real))})")
    return p


def bundle_file(root: Path, manifest: dict, rel, what: str) -> Path:
    """ROOT/REL for a path the manifest names (`what` says where): it must be relative, listed in the
    manifest's `files` (so verify_files checked it) and inside the bundle; BundleError otherwise."""
    if not isinstance(rel, str) or not rel or not rel.isprintable():
        raise BundleError(f"bundle {root}: manifest {what} must be a relative path, got {shown(rel)}")
    if _escapes(rel):
        raise BundleError(f"bundle {root}: manifest {what} {shown(rel)} points outside the bundle")
    if rel not in manifest["files"]:
        raise BundleError(f"bundle {root}: manifest {what} {shown(rel)} is not listed in the manifest's files "
                          "(it was never checked)")
    return _inside(root, rel)


def optional_file(root: Path, manifest: dict, rel: str, what: str, named: bool = False) -> Path | None:
    """Like bundle_file for a file the bundle may lack: None if it is neither listed nor present (and
    the manifest does not name it explicitly); a present file must be listed."""
    if not named and rel not in manifest["files"] and not os.path.lexists(root / rel):
        return None
    return bundle_file(root, manifest, rel, what)


def verify_files(root: Path, manifest: dict, verify: str = DEFAULT_VERIFY) -> DigestMemory | None:
    """Every listed file is inside the bundle and exists; unless verify="none", its size and sha256
    match (remembered digests reused unless verify="full"). No symlink in the bundle points outside it.
    Returns the digest memory used (None for "none"), saved."""
    check_required_files(root, manifest)
    _check_symlinks(root)
    memory = DigestMemory() if verify != "none" else None
    to_hash = []
    for rel, meta in manifest["files"].items():
        if not rel.isprintable() or _escapes(rel):
            raise BundleError(f"bundle {root}: bad file path in manifest: {shown(rel)}")
        p = _inside(root, rel)
        if not p.is_file():
            raise BundleError(f"bundle {root}: missing file {rel}")
        if memory is None:
            continue
        size = p.stat().st_size
        if size != meta["bytes"]:
            raise BundleError(f"bundle {root}: {rel} is corrupt (size {size}, manifest says {meta['bytes']})")
        to_hash.append((rel, p, meta["sha256"]))
    reuse = verify != "full"
    if memory is not None:           # the first load after an export or a copy says what takes its time
        memory.say_if_slow([p for _, p, _ in to_hash], "bundle files", reuse=reuse)
    for rel, p, expected in to_hash:
        try:
            digest = memory.sha256(p, reuse=reuse)
        except OSError as exc:
            raise BundleError(f"bundle {root}: {rel} cannot be read ({exc.strerror or exc})") from exc
        if digest != expected:
            raise BundleError(f"bundle {root}: {rel} is corrupt (sha256 mismatch)")
    if memory is not None:
        memory.save()
    return memory


def _check_symlinks(root: Path) -> None:
    """No symlink anywhere in the bundle points outside it (a listed file or not)."""
    base = _resolve(root, root)
    for dirpath, dirnames, filenames in os.walk(root):        # does not descend into symlinked directories
        for name in (*dirnames, *filenames):
            p = Path(dirpath) / name
            if p.is_symlink() and not (real := _resolve(root, p)).is_relative_to(base):
                raise BundleError(f"bundle {root}: {shown(p.relative_to(root).as_posix())} is a symlink to "
                                  f"{shown(str(real))}, outside the bundle")


def _load_side(root: Path, manifest: dict, side: str, memory: DigestMemory | None = None,
               tokenizers: dict | None = None) -> ModelFiles:
    info = manifest[side]
    d = root / side
    onnx_path = bundle_file(root, manifest, info.get("onnx") or f"{side}/model.onnx", f"{side}.onnx")
    io = info["io"]
    check_io(root, side, io)
    tok_path = bundle_file(root, manifest, f"{side}/tokenizer.json", f"{side} tokenizer")
    tok, have = load_tokenizer(root, side, tok_path, memory, {} if tokenizers is None else tokenizers)
    want = info["tokenizer"]["vocab_hash"]
    if have != want:
        raise BundleError(f"bundle {root}: {side}/tokenizer.json is not the {side} tokenizer this bundle was exported "
                          f"with (vocab_hash {have[:12]}…, manifest says {want[:12]}…)")
    tpl = None
    tpl_path = optional_file(root, manifest, f"{side}/chat_template.jinja", f"{side} chat template")
    if tpl_path is not None:
        try:
            tpl = tpl_path.read_text(encoding="utf-8")
        except (OSError, ValueError) as exc:
            raise BundleError(f"bundle {root}: {side}/chat_template.jinja is unreadable ({exc})") from exc
    target = side == "target"     # the target's optional graphs: export/prefill_graph.py, export/padded_attention.py
    prefill = optional_file(root, manifest, "target/prefill.onnx", "target prefill graph") if target else None
    padded = optional_file(root, manifest, "target/padded_attention.onnx", "target padded-attention graph") if target else None
    # before 2026-11-27 the export wrote the padded-attention graph only where its check found 0.0
    checks = manifest.get("checks") or {}
    if not isinstance(checks, dict):
        raise BundleError(f"bundle {root}: manifest 'checks' must be an object, got {type(checks).__name__}")
    padded_diff = checks.get("padded_attention_vs_padded_steps_max_abs_diff")
    return ModelFiles(dir=d, onnx=onnx_path, info=info, tokenizer_file=tok, chat_template=tpl, io=io,
                      prefill_onnx=prefill, padded_onnx=padded,
                      padded_exact_at_export=padded is not None and padded_diff in (None, 0, 0.0))


def _why(exc: BaseException) -> str:
    """An exception's message on one line, at most 160 characters."""
    return " ".join(f"{type(exc).__name__}: {exc}".split())[:160]


def _load_npy(root: Path, path: Path, dtype) -> np.ndarray:
    rel = path.relative_to(root)
    if not path.is_file():
        raise BundleError(f"bundle {root}: missing file {rel}")
    try:
        arr = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
        raise BundleError(f"bundle {root}: {rel} is corrupt ({_why(exc)})") from exc
    if not isinstance(arr, np.ndarray):
        arr.close()
        raise BundleError(f"bundle {root}: {rel} is not a .npy array")
    if arr.dtype != np.dtype(dtype) or arr.ndim != 1:
        raise BundleError(f"bundle {root}: {rel} is a {arr.dtype} array of shape {arr.shape}, expected a 1-D "
                          f"{np.dtype(dtype)} array")
    return arr


def _load_json(root: Path, path: Path):
    try:
        return jsonio.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise BundleError(f"bundle {root}: {path.relative_to(root)} is unreadable ({_why(exc)})") from exc


def _load_csr(root: Path, path: Path) -> Affinity:
    rel = path.relative_to(root)
    if not path.is_file():
        raise BundleError(f"bundle {root}: missing file {rel}")
    try:
        z = np.load(path, allow_pickle=False)
        if not isinstance(z, np.lib.npyio.NpzFile):
            raise ValueError("not an .npz archive")
        with z:
            data, indices, indptr, shape = z["data"], z["indices"], z["indptr"], z["shape"]
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as exc:
        raise BundleError(f"bundle {root}: {rel} is not a CSR .npz ({_why(exc)})") from exc
    try:
        return Affinity.from_csr(data, indices, indptr, shape)
    except BundleError as exc:
        raise BundleError(f"bundle {root}: {rel}: {exc}") from None
