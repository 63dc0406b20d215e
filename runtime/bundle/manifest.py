"""The bundle manifest, BUNDLE/manifest.json (docs/architecture.md): its format constants, the
structure the exporter writes (export/bundle_files.py builds it through `side_entry`, `vocab_entry` and
`new_manifest`) and the checks the reader runs (runtime/bundle/bundle.py). Torch-free.
"""
from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
from pathlib import Path

from edgespec import __version__, jsonio
from edgespec.errors import BundleError
from edgespec.hashing import sha256_file

FORMAT = "edgespec-bundle"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
SIDES = ("target", "drafter")
MAX_POSITION = 1 << 24     # the longest context a manifest may claim (16M positions): beyond is a damaged manifest
REQUIRED_SECTIONS = ("target", "drafter", "vocab", "files")
# A target-only bundle (no drafter: `ar` and prompt lookup) has "drafter": null and "vocab": null.
TARGET_FILES = ("target/model.onnx", "target/tokenizer.json")
REQUIRED_FILES = TARGET_FILES + ("drafter/model.onnx", "drafter/tokenizer.json", "vocab/index_map.npy",
                                 "vocab/draft_ids.npy", "vocab/drafter_to_target.npy", "vocab/target_to_drafter.npy")
REQUIRED_IO = {
    "target": {"inputs": {"input_ids", "attention_mask"}, "outputs": {"logits"}},
    "drafter": {"inputs": {"input_ids", "attention_mask"}, "outputs": {"logits", "index_map", "draft_ids"}},
}
# A side's model shape, copied from the HF config (export/onnx_export.py's model_info), in manifest order.
MODEL_KEYS = ("arch", "num_layers", "num_heads", "num_kv_heads", "head_dim", "hidden_size", "vocab_size",
              "max_position", "tie_word_embeddings")
PRIOR_KEYS = ("prior", "affinity", "randomised")     # the vocab section's optional priors, None when absent


def manifest_sha256(bundle_dir: str | Path) -> str:
    """sha256 of a bundle's manifest.json: identifies the bundle in reports and calibration provenance."""
    return hashlib.sha256((Path(bundle_dir) / MANIFEST).read_bytes()).hexdigest()


# --------------------------------------------------------------------------- writer

def side_entry(*, source: dict, sub: str, external_data: bool, model: dict, params: int, graph_params: int,
               bytes_per_forward: int, dtype: str, quantization: dict | None, tokenizer: dict, io: dict,
               graph: dict, min_forward_tokens: int, export_cache_key: str) -> dict:
    """The target/drafter entry (the drafter's extra keys are added by the writer after these)."""
    return {
        "source": source, "onnx": f"{sub}/model.onnx", "external_data": external_data,
        **{k: model[k] for k in MODEL_KEYS},
        "params": params, "graph_params": graph_params, "bytes_per_forward": bytes_per_forward, "dtype": dtype,
        "quantization": quantization, "tokenizer": tokenizer, "io": io, "graph": graph,
        "min_forward_tokens": min_forward_tokens, "export_cache_key": export_cache_key,
    }


def vocab_entry(*, kept: int, provenance: dict, intersection: int, kept_with_target: int, target_vocab: int,
                drafter_vocab: int, target_tokenizer_size: int, drafter_tokenizer_size: int,
                priors: dict) -> dict:
    """The vocab section; `priors` maps each of PRIOR_KEYS to its entry or None."""
    return {"kept": kept, "provenance": provenance, "intersection": intersection,
            "kept_with_target": kept_with_target, "target_vocab": target_vocab, "drafter_vocab": drafter_vocab,
            "target_tokenizer_size": target_tokenizer_size, "drafter_tokenizer_size": drafter_tokenizer_size,
            "vocab_file": "vocab/vocab.json", **{k: priors[k] for k in PRIOR_KEYS}}


def new_manifest(*, pair: str | None, same_tokenizer: bool, target: dict, drafter: dict | None, vocab: dict | None,
                 checks: dict, export: dict, files: dict) -> dict:
    """The whole manifest, stamped with the format, this edgespec's version and the time (UTC);
    drafter and vocab are None in a target-only bundle."""
    return {
        "format": FORMAT, "format_version": FORMAT_VERSION, "edgespec_version": __version__,
        "created_utc": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "pair": pair, "same_tokenizer": bool(same_tokenizer), "target": target, "drafter": drafter,
        "vocab": vocab, "checks": checks, "export": export, "files": files,
    }


def list_files(root: Path) -> dict:
    """The files section: {relative path: {"sha256", "bytes"}} of every file under root but the manifest."""
    out = {}
    for f in sorted(p for p in Path(root).rglob("*") if p.is_file()):
        rel = f.relative_to(root).as_posix()
        if rel == MANIFEST:
            continue
        out[rel] = {"sha256": sha256_file(f), "bytes": f.stat().st_size}
    return out


def write_manifest(root: Path, manifest: dict) -> None:
    """Write ROOT/manifest.json atomically (a temporary file renamed into place)."""
    tmp = Path(root) / (MANIFEST + ".tmp")
    tmp.write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, Path(root) / MANIFEST)


# --------------------------------------------------------------------------- reader

def is_bundle_dir(path: Path) -> bool:
    """Whether `path` holds an edgespec bundle's manifest (the exporter replaces only such directories)."""
    m = Path(path) / MANIFEST
    if not m.is_file():
        return False
    try:
        return jsonio.loads(m.read_text()).get("format") == FORMAT
    except (OSError, ValueError):
        return False


def read_manifest(root: Path) -> dict:
    """ROOT/manifest.json, checked for format, version and sections; BundleError otherwise."""
    mpath = root / MANIFEST
    if not mpath.is_file():
        raise BundleError(f"{root} is not an edgespec bundle: {MANIFEST} is missing")
    try:
        manifest = jsonio.loads(mpath.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise BundleError(f"bundle {root}: {MANIFEST} is unreadable or corrupt ({exc})") from exc
    if not isinstance(manifest, dict):
        raise BundleError(f"bundle {root}: {MANIFEST} is not a JSON object (it is a {type(manifest).__name__})")
    if manifest.get("format") != FORMAT:
        raise BundleError(f"{root} is not an edgespec bundle (manifest format {shown(manifest.get('format'))})")
    ver = manifest.get("format_version")
    if ver != FORMAT_VERSION or isinstance(ver, bool):
        raise BundleError(f"bundle {root} has format_version {shown(ver)}; this edgespec reads version {FORMAT_VERSION} "
                          "(re-export it with this version)")
    for key in REQUIRED_SECTIONS:
        if key not in manifest or not (isinstance(manifest[key], dict) or key in ("drafter", "vocab")
                                       and manifest[key] is None):
            raise BundleError(f"bundle {root}: manifest lacks {key!r}")
    if (manifest["drafter"] is None) != (manifest["vocab"] is None):
        raise BundleError(f"bundle {root}: manifest has a {'vocab' if manifest['drafter'] is None else 'drafter'} "
                          "section without the other (a target-only bundle has neither)")
    check_schema(root, manifest)
    return manifest


def is_target_only(manifest: dict) -> bool:
    """A bundle without a drafter (read_manifest has checked that drafter and vocab are both null)."""
    return manifest["drafter"] is None


def _is_int(v, lo: int = 0) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= lo


def _is_path(v) -> bool:
    return isinstance(v, str) and bool(v) and v.isprintable()


def shown(value) -> str:
    """repr(value), one line, at most 60 characters."""
    r = repr(value)
    return r if len(r) <= 60 else r[:57] + "..."


def _expect(root: Path, where: str, value, ok: bool, want: str) -> None:
    if not ok:
        raise BundleError(f"bundle {root}: manifest {where} must be {want}, got {shown(value)}")


_SIDE_SCHEMA = (   # (key, test, description); a missing optional key reads as None
    ("onnx", lambda v: v is None or _is_path(v), "a relative path"),
    ("vocab_size", lambda v: _is_int(v, 1), "an integer >= 1"),
    ("num_layers", lambda v: v is None or _is_int(v, 1), "an integer >= 1"),
    ("max_position", lambda v: v is None or (_is_int(v, 1) and v <= MAX_POSITION), f"an integer in [1, {MAX_POSITION}]"),
    ("tokenizer", lambda v: isinstance(v, dict), "an object"),
    ("io", lambda v: isinstance(v, dict) and all(isinstance(v.get(k), list) and all(isinstance(n, str) for n in v[k])
                                                 for k in ("inputs", "outputs")),
     "an object with lists of names 'inputs' and 'outputs'"),
)
_TOKENIZER_SCHEMA = (
    ("bos_id", lambda v: v is None or _is_int(v), "a token id or null"),
    ("pad_id", lambda v: v is None or _is_int(v), "a token id or null"),
    ("eos_ids", lambda v: v is None or (isinstance(v, list) and all(_is_int(i) for i in v)), "a list of token ids"),
    ("add_bos", lambda v: v is None or isinstance(v, bool), "true or false"),
    ("vocab_hash", lambda v: isinstance(v, str) and len(v) == 64, "a sha256 hex digest"),
)
_PRIOR_SCHEMA = {
    "prior": (lambda v: v is None or _is_path(v), "a relative path or null"),
    "affinity": (lambda v: v is None or _is_path(v) or (isinstance(v, dict) and _is_path(v.get("path"))),
                 "a relative path, an object with a 'path', or null"),
    "randomised": (lambda v: v is None or _is_path(v) or isinstance(v, dict), "a relative path, an object or null"),
}


def check_schema(root: Path, manifest: dict) -> None:
    """The manifest values the runtime reads have the types and ranges it needs (one-line BundleError)."""
    _expect(root, "same_tokenizer", manifest.get("same_tokenizer"), isinstance(manifest.get("same_tokenizer"), bool),
            "true or false")
    if is_target_only(manifest):
        _expect(root, "same_tokenizer", manifest["same_tokenizer"], manifest["same_tokenizer"],
                "true in a target-only bundle")
    for side in SIDES[:1] if is_target_only(manifest) else SIDES:
        info = manifest[side]
        for key, ok, want in _SIDE_SCHEMA:
            _expect(root, f"{side}.{key}", info.get(key), ok(info.get(key)), want)
        for key, ok, want in _TOKENIZER_SCHEMA:
            value = info["tokenizer"].get(key)
            _expect(root, f"{side}.tokenizer.{key}", value, ok(value), want)
    vocab = manifest["vocab"]
    if vocab is not None:
        _expect(root, "vocab.kept", vocab.get("kept"), _is_int(vocab.get("kept"), 1), "an integer >= 1")
        _expect(root, "vocab.vocab_file", vocab.get("vocab_file"), vocab.get("vocab_file") is None
                or _is_path(vocab.get("vocab_file")), "a relative path")
        for key, (ok, want) in _PRIOR_SCHEMA.items():
            _expect(root, f"vocab.{key}", vocab.get(key), ok(vocab.get(key)), want)
    for rel, meta in manifest["files"].items():
        _expect(root, "files key", rel, _is_path(rel), "a relative path")
        _expect(root, f"files[{shown(rel)}]", meta, isinstance(meta, dict) and _is_int(meta.get("bytes"))
                and isinstance(meta.get("sha256"), str) and len(meta["sha256"]) == 64,
                "an object with 'bytes' (an integer >= 0) and 'sha256' (a hex digest)")


def check_required_files(root: Path, manifest: dict) -> None:
    """The files section lists every file the runtime needs."""
    for rel in TARGET_FILES if is_target_only(manifest) else REQUIRED_FILES:
        if rel not in manifest["files"]:
            raise BundleError(f"bundle {root}: manifest does not list required file {rel}")


def check_io(root: Path, side: str, io: dict) -> None:
    """A side's graph has the input and output names the runtime feeds and reads."""
    need = REQUIRED_IO[side]
    missing_in = need["inputs"] - set(io.get("inputs", []))
    missing_out = need["outputs"] - set(io.get("outputs", []))
    if missing_in or missing_out:
        raise BundleError(f"bundle {root}: {side} graph lacks IO names {sorted(missing_in | missing_out)}")
