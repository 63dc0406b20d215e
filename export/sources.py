"""Model sources: recipe name, local HF directory, GGUF file, or hub id -> an HF directory.

A recipe is pulled (installed, verified, converted once) by edgespec.models.weights; a GGUF file is
converted once into <cache>/models/gguf-<sha256 prefix>/; a hub id is downloaded by huggingface_hub.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

from edgespec.errors import ModelSourceError
from edgespec.hashing import sha256_file
from edgespec.models import model_recipes
from edgespec.models.gguf_tokenizer import converted_here
from edgespec.models.weights import SOURCE_FILE, ModelSource, cached_dir, convert_gguf, pull, refresh_tokenizer
from edgespec.paths import models_dir


def _dir_digest(d: Path) -> str:
    h = hashlib.sha256()
    for f in sorted(d.iterdir()):
        if f.is_file() and f.suffix in {".json", ".safetensors", ".bin", ".model", ".txt"}:
            h.update(f.name.encode())
            h.update(sha256_file(f).encode())
    return h.hexdigest()


def resolve(spec: str, progress: bool = True) -> ModelSource:
    """Any model source: recipe name, HF directory, GGUF file, or hub id."""
    if spec in model_recipes():
        return pull(spec, progress)
    path = Path(spec).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelSourceError(f"{spec}: directory has no config.json, not an HF model directory")
        prov = path / SOURCE_FILE
        digest = json.loads(prov.read_text())["sha256"] if prov.is_file() else _dir_digest(path)
        return ModelSource(spec, "hf_dir", path, digest, path.name)
    if path.suffix == ".gguf" or path.is_file():
        if not path.is_file():
            raise ModelSourceError(f"{spec}: no such GGUF file")
        digest = sha256_file(path, progress)
        out = models_dir() / f"gguf-{digest[:16]}"
        if cached_dir(out.name) is None:
            convert_gguf(path, out, {"gguf": str(path), "sha256": digest})
        elif not converted_here(out):        # written by an older tokenizer converter
            refresh_tokenizer(out, path)
        return ModelSource(spec, "gguf", out, digest, path.stem)
    if "/" in spec and not spec.startswith((".", "/")):
        return _from_hub(spec)
    raise ModelSourceError(f"unknown model source {spec!r}: not a recipe ({', '.join(sorted(model_recipes()))}), "
                           "directory, GGUF file or hub id")


def _from_hub(repo_id: str) -> ModelSource:
    try:  # lazy: comes with the [export] extra
        from huggingface_hub import snapshot_download  # lazy: comes with the [export] extra
    except ImportError as exc:
        raise ModelSourceError(f"hub id {repo_id!r} needs huggingface_hub (the [export] extra)") from exc
    try:
        d = Path(snapshot_download(repo_id, allow_patterns=["*.json", "*.safetensors", "*.model", "*.txt"], etag_timeout=5))
    except Exception as exc:
        if type(exc).__name__ in ("RepositoryNotFoundError", "GatedRepoError", "RevisionNotFoundError"):
            raise ModelSourceError(f"hub id {repo_id!r} was not found on the model hub (or needs access rights)") from exc
        raise ModelSourceError(f"hub id {repo_id!r}: the model hub is not reachable from this machine "
                               f"({type(exc).__name__}); use a recipe name, an HF directory or a GGUF file") from exc
    if not (d / "config.json").is_file():
        raise ModelSourceError(f"hub id {repo_id!r} has no config.json: not a transformers model")
    return ModelSource(repo_id, "hub", d, _dir_digest(d), repo_id.split("/")[-1])
