"""Each default is written once: the library, the command lines and the server read it from there
(issue 49). The scan reads every default the package's source writes as a literal (parameter
defaults, dataclass fields, module constants, argparse `default=`); a second copy of one fails here.
Also: `max_draft_length` above the plan's gamma cap is honoured under strategy "auto", not capped."""
import ast
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ("edgespec", "runtime", "calibrate", "export", "profiler", "serve", "models")
# (what, the names it goes by once a DEFAULT_ prefix is dropped, its value): defined exactly once
ONCE = [("max_new_tokens", {"max_new_tokens"}, 128),
        ("the gamma cap", {"max_gamma", "max_draft_length"}, 8),
        ("draft_length", {"draft_length"}, "auto"),
        ("strategy", {"strategy"}, "auto")]
# a command line and the settings it fills: no default written in both
PAIRS = [("profiler/cli.py", ("profiler/settings.py",)),
         ("serve/cli.py", ("serve/settings.py", "serve/worker.py")),
         ("runtime/cli.py", ("runtime/api/decoder.py", "runtime/api/config.py", "runtime/arguments.py"))]


def literal_defaults(source: str) -> list[tuple[str, object, int]]:
    """(name, value, line) of each default written as a literal in `source`."""
    out = []

    def add(name, node):
        if isinstance(node, ast.Constant) and node.value is not None and name:
            key = name.lower().lstrip("-").replace("-", "_")
            out.append((key.removeprefix("default_"), node.value, node.lineno))

    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            a = node.args
            positional = a.posonlyargs + a.args
            for arg, default in zip(positional[len(positional) - len(a.defaults):], a.defaults):
                add(arg.arg, default)
            for arg, default in zip(a.kwonlyargs, a.kw_defaults):
                if default is not None:
                    add(arg.arg, default)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
            add(node.target.id, node.value)
        elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            add(node.targets[0].id, node.value)
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument"
              and node.args and isinstance(node.args[0], ast.Constant)):
            for kw in node.keywords:
                if kw.arg == "default":
                    add(str(node.args[0].value), kw.value)
    return out


def package_defaults() -> dict[str, list]:
    return {str(p.relative_to(ROOT)): literal_defaults(p.read_text()) for folder in PACKAGE
            for p in sorted((ROOT / folder).rglob("*.py"))}


@pytest.mark.parametrize("what,names,value", ONCE, ids=[o[0] for o in ONCE])
def test_each_listed_default_is_written_once(what, names, value):
    found = [f"{path}:{line}" for path, defaults in package_defaults().items()
             for name, v, line in defaults if name in names and v == value and type(v) is type(value)]
    assert len(found) == 1, f"{what} = {value!r} is written {len(found)} times: {found} (write it once, read it)"


@pytest.mark.parametrize("cli,settings", PAIRS, ids=[p[0] for p in PAIRS])
def test_a_command_line_reads_its_settings_defaults(cli, settings):
    flags = {name: line for name, _, line in literal_defaults((ROOT / cli).read_text())}
    both = sorted(f"{name} ({cli}:{flags[name]}, {path}:{line})" for path in settings
                  for name, _, line in literal_defaults((ROOT / path).read_text()) if name in flags)
    assert not both, f"defaults written in the command line and in its settings: {both}"


def test_the_scan_finds_a_second_copy():
    """The scan sees each way a default is written (so the tests above can fail)."""
    source = ('import argparse\nMAX_GAMMA = 8\ndef generate(p, max_new_tokens: int = 128, *, draft_length="auto"): ...\n'
              'class S:\n    max_new_tokens: int = 128\n'
              'argparse.ArgumentParser().add_argument("--max-new-tokens", type=int, default=128)\n')
    names = [(name, value) for name, value, _ in literal_defaults(source)]
    assert names.count(("max_new_tokens", 128)) == 3 and ("max_gamma", 8) in names and ("draft_length", "auto") in names


def _resolve_auto(max_draft_length: int, plan_gamma_max: int) -> int | None:
    """The bound an `auto` decoder's step plan (records.step_plan) puts on its drafter rounds."""
    from edgespec.runtime.api.config import DecodeConfig
    from edgespec.runtime.planning.plan import Plan
    from edgespec.runtime.planning.records import step_plan
    from edgespec.runtime.round.strategies import get_strategy

    plan = Plan("model", 1, drafter=True, gamma_max=plan_gamma_max, free_guess=False, source="profile")
    config = DecodeConfig(strategy=get_strategy("tli"), draft_length="auto", max_draft_length=max_draft_length)
    return step_plan(plan, config, 1, auto=True).drafter_gamma


def test_max_draft_length_above_the_plans_cap_is_honoured():
    from edgespec.runtime.planning.plan import MAX_GAMMA

    assert _resolve_auto(MAX_GAMMA + 4, plan_gamma_max=3) == MAX_GAMMA + 4     # the caller's, not the plan's
    assert _resolve_auto(MAX_GAMMA, plan_gamma_max=3) == 3                     # the default: the plan's range
