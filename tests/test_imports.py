"""The import graph of the edgespec package (docs/architecture.md, "Packages").

- Every module imports on its own, in a fresh interpreter, and no runtime module pulls in torch.
- The imports between edgespec modules, module-level and function-level alike, form no cycle.
- Imports cross packages only downward: profiler -> calibrate -> export -> runtime and models ->
  the top-level helpers (edgespec.errors, .hashing, .paths); the CLI (edgespec.cli) sits on top.
"""
from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "transformers", "optimum")
# Layer of each package (a module may import its own layer and the layers below it).
LAYERS = {"edgespec": 0, "edgespec.runtime": 1, "edgespec.models": 1, "edgespec.export": 2, "edgespec.serve": 2,
          "edgespec.calibrate": 3,
          "edgespec.profiler": 4, "edgespec.cli": 5, "edgespec.__main__": 5}
SCRIPTS = {"edgespec.__main__"}          # runs the CLI when imported: not imported here
CHILD = ("import importlib, json, sys; importlib.import_module(sys.argv[1]); "
         f"print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))")


def package_dirs() -> dict[str, Path]:
    """pyproject.toml's package-dir mapping: import package -> folder."""
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    return {pkg: ROOT / folder for pkg, folder in cfg["tool"]["setuptools"]["package-dir"].items()}


def modules() -> dict[str, Path]:
    out = {}
    for pkg, folder in package_dirs().items():
        for f in sorted(folder.glob("*.py")):
            out[pkg if f.stem == "__init__" else f"{pkg}.{f.stem}"] = f
    return out


def layer(module: str) -> int:
    best = max((p for p in LAYERS if module == p or module.startswith(p + ".")), key=len)
    return LAYERS[best]


def import_graph(mods: dict[str, Path]) -> dict[str, dict[str, int]]:
    """{module: {imported edgespec module: line}}, every import statement counted wherever it stands."""
    graph: dict[str, dict[str, int]] = {}
    for name, path in mods.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges: dict[str, int] = {}
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:              # relative: resolved against this module's package
                    parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(parts + ([node.module] if node.module else []))
                else:
                    base = node.module or ""
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            else:
                continue
            for target in targets:
                while target and target not in mods:    # a name inside a module -> that module
                    target = target.rpartition(".")[0]
                if target and target != name:
                    edges.setdefault(target, node.lineno)
        graph[name] = edges
    return graph


def find_cycle(graph: dict[str, dict[str, int]]) -> list[str] | None:
    state: dict[str, int] = {}          # 1 on the current path, 2 done
    path: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        path.append(m)
        for n in sorted(graph.get(m, {})):
            if state.get(n) == 1:
                return path[path.index(n):] + [n]
            if n not in state and (cycle := visit(n)):
                return cycle
        path.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state and (cycle := visit(m)):
            return cycle
    return None


def test_every_module_imports_alone_and_the_runtime_without_torch():
    names = [m for m in modules() if m not in SCRIPTS]
    env = dict(os.environ, TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS="1")
    running: list[tuple[str, subprocess.Popen]] = []
    results: dict[str, tuple[int, str, str]] = {}
    width = max(2, os.cpu_count() or 2)
    pending = list(names)
    while pending or running:
        while pending and len(running) < width:
            m = pending.pop(0)
            running.append((m, subprocess.Popen([sys.executable, "-c", CHILD, m], stdout=subprocess.PIPE,
                                                stderr=subprocess.PIPE, text=True, env=env)))
        m, proc = running.pop(0)
        out, err = proc.communicate(timeout=120)
        results[m] = (proc.returncode, out, err)
    failed = {m: err.strip().splitlines()[-1:] for m, (rc, _, err) in results.items() if rc != 0}
    assert not failed, f"modules that do not import on their own: {failed}"
    heavy = {m: json.loads(out.strip().splitlines()[-1]) for m, (_, out, _) in results.items()
             if m.startswith("edgespec.runtime")}
    assert not {m: h for m, h in heavy.items() if h}, f"runtime modules importing torch & co: {heavy}"


def test_no_import_cycle():
    cycle = find_cycle(import_graph(modules()))
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_imports_go_only_downward():
    upward = [f"{a} (line {line}) -> {b}" for a, edges in import_graph(modules()).items()
              for b, line in edges.items() if layer(b) > layer(a)]
    assert not upward, "imports against the layering:\n" + "\n".join(upward)


def test_the_graph_sees_function_level_and_relative_imports(tmp_path):
    pkg = tmp_path / "p"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from . import b\n    from .b import g\n")
    (pkg / "b.py").write_text("import p.a\n")
    mods = {"p": pkg / "__init__.py", "p.a": pkg / "a.py", "p.b": pkg / "b.py"}
    graph = import_graph(mods)
    assert graph["p.a"] == {"p.b": 2} and graph["p.b"] == {"p.a": 1}
    assert find_cycle(graph) in (["p.a", "p.b", "p.a"], ["p.b", "p.a", "p.b"])
