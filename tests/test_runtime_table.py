"""docs/runtime.md's module table says what the code does: every runtime module is listed, and each
imports only modules listed below it (or in its own row), lazy imports included."""
import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def table_rows() -> list[list[str]]:
    """The module names of each row of docs/runtime.md's "Modules" table, top to bottom."""
    section = (ROOT / "docs" / "runtime.md").read_text().split("## Modules", 1)[1].split("\n## ", 1)[0]
    return [re.findall(r"`([a-z_]+)\.py`", line.split("|")[1]) for line in section.splitlines()
            if line.startswith("| `")]


def runtime_imports(name: str) -> set[str]:
    tree = ast.parse((ROOT / "runtime" / f"{name}.py").read_text())
    return {n.module.split(".")[2] for n in ast.walk(tree)
            if isinstance(n, ast.ImportFrom) and n.module and n.module.startswith("edgespec.runtime.")}


def test_every_runtime_module_is_in_the_table():
    listed = {m for row in table_rows() for m in row}
    modules = {p.stem for p in (ROOT / "runtime").glob("*.py")} - {"__init__"}
    assert not modules - listed, f"runtime modules missing from docs/runtime.md's table: {sorted(modules - listed)}"
    assert not listed - modules, f"docs/runtime.md lists modules that do not exist: {sorted(listed - modules)}"


def test_imports_go_down_the_table():
    row_of = {m: i for i, row in enumerate(table_rows()) for m in row}
    upward = sorted(f"{m} -> {t}" for m, i in row_of.items() for t in runtime_imports(m)
                    if t in row_of and row_of[t] < i)
    assert not upward, f"imports that go up docs/runtime.md's table: {upward}"
