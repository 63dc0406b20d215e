"""Model and pair recipes (TOML files in this folder). Torch-free.

A model recipe names the pip package(s) carrying GGUF weights, the ordered files that join
into one GGUF, and the pinned sha256 of the joined file. A pair recipe names a target and a
drafter recipe and the default kept-vocabulary size.
"""
from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from importlib import resources

from edgespec.errors import ModelSourceError


@dataclass(frozen=True)
class ModelRecipe:
    name: str
    description: str
    arch: str
    instruct: bool
    packages: tuple[str, ...]
    files: tuple[str, ...]  # "module:relative/path", joined in order
    gguf_name: str
    sha256: str
    size: int | None = None


@dataclass(frozen=True)
class PairRecipe:
    name: str
    description: str
    target: str
    drafter: str
    keep: int
    default: bool = False
    extra: dict = field(default_factory=dict)


def _toml_files() -> dict[str, dict]:
    out = {}
    for entry in resources.files(__name__).iterdir():
        if entry.name.endswith(".toml"):
            out[entry.name[:-5]] = tomllib.loads(entry.read_text(encoding="utf-8"))
    return out


def model_recipes() -> dict[str, ModelRecipe]:
    recipes = {}
    for stem, data in _toml_files().items():
        if stem == "pairs":
            continue
        w = data["weights"]
        recipes[data["name"]] = ModelRecipe(
            name=data["name"], description=data.get("description", ""), arch=data["arch"],
            instruct=bool(data.get("instruct", False)), packages=tuple(w["packages"]),
            files=tuple(w["files"]), gguf_name=w["gguf_name"], sha256=w["sha256"].lower(),
            size=w.get("size"),
        )
    return recipes


def pair_recipes() -> dict[str, PairRecipe]:
    data = _toml_files().get("pairs", {})
    known = {"description", "target", "drafter", "keep", "default"}
    return {
        name: PairRecipe(name=name, description=p.get("description", ""), target=p["target"],
                         drafter=p["drafter"], keep=int(p.get("keep", 32768)),
                         default=bool(p.get("default", False)),
                         extra={k: v for k, v in p.items() if k not in known})
        for name, p in data.items()
    }


def get_model(name: str) -> ModelRecipe:
    recipes = model_recipes()
    if name not in recipes:
        raise ModelSourceError(f"unknown model recipe {name!r}; known: {', '.join(sorted(recipes))}")
    return recipes[name]


def get_pair(name: str) -> PairRecipe:
    pairs = pair_recipes()
    if name not in pairs:
        raise ModelSourceError(f"unknown pair recipe {name!r}; known: {', '.join(sorted(pairs))}")
    return pairs[name]


def default_pair() -> PairRecipe:
    return next(p for p in pair_recipes().values() if p.default)
