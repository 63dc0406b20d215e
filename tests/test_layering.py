"""The round reads no decoder: the round modules import nothing above them and reach nothing through a
`dec` (the state a generation needs comes in shared.Shared and shared.Setup); no module grows past the
size the guide asks for."""
import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ROUND_MODULES = ("generation", "rounds", "slem", "ngram", "tli", "rdk", "slrs", "randomised", "strategies",
                 "verify", "context", "governor", "shared")
ABOVE_THE_ROUND = {"edgespec.runtime.api.decoder", "edgespec.runtime.planning.device_plan", "edgespec.runtime.cli",
                   "edgespec.runtime.arguments", "edgespec.serve"}
MAX_LINES = 400


@pytest.mark.parametrize("name", ROUND_MODULES)
def test_a_round_module_reads_no_decoder(name):
    tree = ast.parse(next((ROOT / "runtime").rglob(f"{name}.py")).read_text())
    imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
    imported |= {a.name for node in ast.walk(tree) if isinstance(node, ast.Import) for a in node.names}
    above = {m for m in imported if any(m == a or m.startswith(a + ".") for a in ABOVE_THE_ROUND)}
    assert not above, f"runtime/{name}.py imports {sorted(above)}"
    through_dec = sorted({f"{ast.unparse(n.value)}.{n.attr}" for n in ast.walk(tree)
                          if isinstance(n, ast.Attribute) and ast.unparse(n.value).split(".")[-1] == "dec"})
    assert not through_dec, f"runtime/{name}.py reads {through_dec}"


def test_the_checks_above_can_fail():
    """The same checks find a decoder read and an upward import in a made-up module."""
    tree = ast.parse("from edgespec.runtime.api.decoder import SpeculativeDecoder\nx = gen.dec.target\n")
    reads = [n for n in ast.walk(tree) if isinstance(n, ast.Attribute) and ast.unparse(n.value).split(".")[-1] == "dec"]
    modules = [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    assert reads and modules == ["edgespec.runtime.api.decoder"] and modules[0] in ABOVE_THE_ROUND


def test_no_module_over_the_size_limit():
    big = {str(p.relative_to(ROOT)): n for folder in ("runtime", "calibrate", "export", "profiler", "serve", "models")
           for p in (ROOT / folder).rglob("*.py") if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not big, f"modules over {MAX_LINES} lines: {big}"
