"""Where edgespec caches things: $EDGESPEC_HOME, else $XDG_CACHE_HOME/edgespec, else ~/.cache/edgespec."""
from __future__ import annotations

import os
from pathlib import Path


def cache_home() -> Path:
    if os.environ.get("EDGESPEC_HOME"):
        return Path(os.environ["EDGESPEC_HOME"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "edgespec"


def models_dir() -> Path:
    """Converted HF model directories, one per recipe: <cache>/models/<name>/."""
    return cache_home() / "models"


def exports_dir() -> Path:
    """Cached single-model ONNX exports keyed by input hash: <cache>/onnx/<key>/."""
    return cache_home() / "onnx"
