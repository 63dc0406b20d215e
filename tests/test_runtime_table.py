"""docs/runtime.md's module table draws runtime/ as it is: every module is listed, as `room/module.py`
(the front, cli/arguments/doctor, at the top without a room), each room's rows together, and each module
imports only modules listed below it (or in its own row), lazy imports included: so imports between
rooms go one way, down the table."""
import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUNTIME = ROOT / "runtime"


def table_rows() -> list[list[tuple[str, str]]]:
    """The (room, module) names of each row of docs/runtime.md's "Modules" table, top to bottom."""
    section = (ROOT / "docs" / "runtime.md").read_text().split("## Modules", 1)[1].split("\n## ", 1)[0]
    return [re.findall(r"`(?:([a-z_]+)/)?([a-z_]+)\.py`", line.split("|")[1]) for line in section.splitlines()
            if line.startswith("| `")]


def module_files() -> dict[tuple[str, str], Path]:
    """(room, module) -> file, for every runtime module ("" is the front's room)."""
    return {("" if p.parent == RUNTIME else p.parent.name, p.stem): p for p in RUNTIME.rglob("*.py")
            if p.name != "__init__.py" and "__pycache__" not in p.parts}


def runtime_imports(path: Path) -> set[str]:
    """The runtime modules a file imports (by module name), lazy imports included."""
    found = set()
    for n in ast.walk(ast.parse(path.read_text())):
        if isinstance(n, ast.ImportFrom) and n.module and n.module.startswith("edgespec.runtime."):
            parts = n.module.split(".")
            found |= {a.name for a in n.names} if len(parts) == 3 else {parts[-1]}
    return found


def test_every_runtime_module_is_in_the_table():
    listed = {m for row in table_rows() for m in row}
    modules = set(module_files())
    assert not modules - listed, f"runtime modules missing from docs/runtime.md's table: {sorted(modules - listed)}"
    assert not listed - modules, f"docs/runtime.md lists modules that do not exist: {sorted(listed - modules)}"


def test_imports_go_down_the_table():
    row_of = {name: i for i, row in enumerate(table_rows()) for _, name in row}
    files = {name: path for (_, name), path in module_files().items()}
    upward = sorted(f"{m} -> {t}" for m, i in row_of.items() for t in runtime_imports(files[m])
                    if t in row_of and row_of[t] < i)
    assert not upward, f"imports that go up docs/runtime.md's table: {upward}"


def test_each_room_is_one_block_of_the_table():
    rooms = [room for row in table_rows() for room, _ in row]
    blocks = [r for i, r in enumerate(rooms) if i == 0 or rooms[i - 1] != r]
    assert len(blocks) == len(set(blocks)), f"a room's rows are split in the table: {blocks}"
    assert all((RUNTIME / r / "__init__.py").is_file() for r in set(rooms) if r), "a room without its package"


def test_the_table_check_can_fail():
    """An upward import in a made-up table is found (the checks above can fail)."""
    rows = [[("api", "decoder")], [("engine", "kv")]]
    row_of = {name: i for i, row in enumerate(rows) for _, name in row}
    assert row_of["decoder"] < row_of["kv"]          # kv importing decoder would go up
    tree = "from edgespec.runtime.api.decoder import SpeculativeDecoder\nfrom edgespec.runtime.engine import kv\n"
    p = ROOT / "tests" / "_made_up_module.py"
    try:
        p.write_text(tree)
        assert runtime_imports(p) == {"decoder", "kv"}
    finally:
        p.unlink()
