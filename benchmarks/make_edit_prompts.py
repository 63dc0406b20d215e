"""Build benchmarks/edit.jsonl: code-editing prompts from functions of Python's standard library, in
Spec-Bench's format ({"question_id", "category", "turns": [text]}), for prompt-lookup drafting
(`ngram`): the answer repeats most of the prompt's code.

    python benchmarks/make_edit_prompts.py [--n 12] [--out benchmarks/edit.jsonl]

Reproducible: the functions are picked from a fixed module list in a fixed order, and only their
source text (inspect.getsource) is used; the same Python version gives the same file.
"""
from __future__ import annotations

import argparse
import ast
import importlib
import inspect
import json
import textwrap
from pathlib import Path

MODULES = ("textwrap", "shlex", "fnmatch", "difflib", "colorsys", "calendar", "statistics", "heapq", "bisect",
           "base64", "string", "ipaddress")
TASKS = ("add-type-hints", "rename-variable", "add-docstring")
MIN_LINES, MAX_LINES = 8, 30


def candidates():
    """(module, name, source) of plain top-level functions of 8-30 lines, in a fixed order."""
    for mod_name in MODULES:
        mod = importlib.import_module(mod_name)
        for name, fn in sorted(vars(mod).items()):
            if not inspect.isfunction(fn) or fn.__module__ != mod_name or name.startswith("_"):
                continue
            try:
                src = textwrap.dedent(inspect.getsource(fn))
            except (OSError, TypeError):
                continue
            if MIN_LINES <= src.count("\n") <= MAX_LINES:
                yield mod_name, name, src


def local_variable(src: str) -> str | None:
    """The first variable assigned in the function body (a name worth renaming), if any."""
    fn = ast.parse(src).body[0]
    for node in ast.walk(fn):
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name) and len(node.targets[0].id) > 1:
            return node.targets[0].id
    return None


def prompt(task: str, name: str, src: str) -> str | None:
    if task == "add-type-hints":
        return f"Add type hints to the function `{name}` below. Reply with the whole function.\n\n```python\n{src}```"
    if task == "add-docstring":
        return (f"Add a docstring to the function `{name}` below (replace the existing one if there is one). "
                f"Reply with the whole function.\n\n```python\n{src}```")
    var = local_variable(src)
    if var is None:
        return None
    return (f"Rename the variable `{var}` to `{var}_value` in the function `{name}` below. Reply with the whole "
            f"function.\n\n```python\n{src}```")


def build(n: int) -> list[dict]:
    out = []
    for mod, name, src in candidates():
        text = prompt(TASKS[len(out) % len(TASKS)], name, src)
        if text is not None:
            out.append({"question_id": f"edit-{len(out):02d}", "category": TASKS[(len(out)) % len(TASKS)],
                        "source": f"{mod}.{name}", "turns": [text]})
        if len(out) == n:
            break
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=12)
    ap.add_argument("--out", default=str(Path(__file__).with_name("edit.jsonl")))
    args = ap.parse_args()
    rows = build(args.n)
    Path(args.out).write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(f"{len(rows)} prompts -> {args.out}")


if __name__ == "__main__":
    main()
