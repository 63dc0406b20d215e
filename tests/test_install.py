"""pyproject.toml's dependency markers: `pip install edgespec` gets exactly one ONNX Runtime build on every
edge platform, the ORT range is open upward, and the EP extras apply only where their wheels exist.

No network: markers are evaluated with packaging for each platform's marker environment. The real
resolution per platform (pip/uv dry runs against PyPI) is in docs/install.md.
"""
from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from packaging.markers import Marker
from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
ORT_BUILDS = {"onnxruntime", "onnxruntime-gpu", "onnxruntime-directml", "onnxruntime-qnn", "onnxruntime-openvino"}


def _env(sys_platform: str, system: str, machine: str, os_name: str) -> dict:
    return {"sys_platform": sys_platform, "platform_system": system, "platform_machine": machine, "os_name": os_name,
            "python_version": "3.11", "python_full_version": "3.11.9", "implementation_name": "cpython",
            "platform_python_implementation": "CPython", "platform_release": "", "platform_version": "",
            "implementation_version": "3.11.9", "extra": ""}


# platform_machine as Python reports it there (Windows says AMD64/ARM64, macOS arm64, Linux aarch64)
PLATFORMS = {
    "linux-x86_64": _env("linux", "Linux", "x86_64", "posix"),
    "linux-aarch64": _env("linux", "Linux", "aarch64", "posix"),
    "darwin-arm64": _env("darwin", "Darwin", "arm64", "posix"),
    "darwin-x86_64": _env("darwin", "Darwin", "x86_64", "posix"),
    "win32-AMD64": _env("win32", "Windows", "AMD64", "nt"),
    "win32-ARM64": _env("win32", "Windows", "ARM64", "nt"),
}
# where each build must apply (PyPI wheels, checked with `pip index versions --platform ...`, 2026-11)
EXPECTED_BASE = {"linux-x86_64": "onnxruntime-gpu", "win32-AMD64": "onnxruntime-gpu", "linux-aarch64": "onnxruntime",
                 "darwin-arm64": "onnxruntime", "darwin-x86_64": "onnxruntime", "win32-ARM64": "onnxruntime"}
EXPECTED_EXTRA = {
    "directml": {"win32-AMD64"},
    "qnn": {"win32-ARM64", "win32-AMD64"},
    "openvino": {"linux-x86_64", "win32-AMD64"},
}


def _project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]


def _applies(req: Requirement, env: dict) -> bool:
    return req.marker is None or req.marker.evaluate(env)


def _base_ort() -> list[Requirement]:
    return [r for r in map(Requirement, _project()["dependencies"]) if r.name in ORT_BUILDS]


@pytest.mark.parametrize("platform", sorted(PLATFORMS))
def test_base_install_gets_exactly_one_onnxruntime_build(platform):
    env = PLATFORMS[platform]
    applying = [r.name for r in _base_ort() if _applies(r, env)]
    assert applying == [EXPECTED_BASE[platform]], f"{platform}: base ORT requirements that apply: {applying}"


def test_base_onnxruntime_range_is_open_upward_and_the_same_for_every_build():
    """A library does not pin ORT to one minor: `>=LOWEST` only (an upper bound needs a comment naming
    the known break right above the requirement in pyproject.toml)."""
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8").splitlines()
    lowers = set()
    for req in _base_ort():
        ops = {s.operator for s in req.specifier}
        assert ">=" in ops, f"{req}: no lower bound"
        lowers |= {Version(s.version) for s in req.specifier if s.operator == ">="}
        if ops - {">=", "!="}:      # <, <=, ==, ~=, ===: a cap
            line = next(i for i, ln in enumerate(text) if ln.strip().startswith(f'"{req.name}'))
            assert "known break" in text[line - 1].lower(), f"{req}: an upper bound without a comment naming the break"
    assert len(lowers) == 1, f"onnxruntime and onnxruntime-gpu have different lower bounds: {lowers}"


def test_lowest_onnxruntime_is_the_one_make_test_lowest_ort_checks():
    """`make test-lowest-ort` installs LOWEST_ORT (Makefile); it must be the floor pyproject.toml allows."""
    m = re.search(r"^LOWEST_ORT\s*\?=\s*(\S+)", (ROOT / "Makefile").read_text(encoding="utf-8"), re.M)
    assert m, "Makefile has no LOWEST_ORT"
    floor = {Version(s.version) for r in _base_ort() for s in r.specifier if s.operator == ">="}
    assert floor == {Version(m.group(1))}, f"Makefile LOWEST_ORT {m.group(1)} != pyproject floor {floor}"


@pytest.mark.parametrize("extra", sorted(EXPECTED_EXTRA))
def test_ep_extras_apply_only_where_their_wheels_exist(extra):
    reqs = [Requirement(r) for r in _project()["optional-dependencies"][extra]]
    assert reqs and all(r.name in ORT_BUILDS for r in reqs), reqs
    where = {p for p, env in PLATFORMS.items() if any(_applies(r, env) for r in reqs)}
    assert where == EXPECTED_EXTRA[extra]


@pytest.mark.parametrize("platform", sorted(PLATFORMS))
def test_export_genai_build_matches_the_base_onnxruntime_build(platform):
    """onnxruntime-genai-cuda depends on onnxruntime-gpu, onnxruntime-genai on onnxruntime: the extra must
    pick the one whose ORT is the base build there, or it pulls a second `onnxruntime` module over it."""
    env = PLATFORMS[platform]
    genai = [r.name for r in map(Requirement, _project()["optional-dependencies"]["export"])
             if r.name.startswith("onnxruntime-genai") and _applies(r, env)]
    want = "onnxruntime-genai-cuda" if EXPECTED_BASE[platform] == "onnxruntime-gpu" else "onnxruntime-genai"
    assert genai == [want]


def test_markers_parse_with_the_packaging_pip_uses():
    """Every marker in the base deps and extras is valid PEP 508 (pip would refuse the wheel otherwise)."""
    proj = _project()
    for spec in [*proj["dependencies"], *(r for reqs in proj["optional-dependencies"].values() for r in reqs)]:
        req = Requirement(spec)
        if req.marker is not None:
            Marker(str(req.marker))


def test_the_serve_extra_brings_the_grammar_engine():
    """`pip install "edgespec[serve]"` serves response_format and tools (README): llguidance comes with it,
    at the [grammar] extra's range, and the runtime's missing-engine message names [serve]."""
    from edgespec.runtime.samplers.grammar import INSTALL
    extras = _project()["optional-dependencies"]
    serve = {r.name: r for r in map(Requirement, extras["serve"])}
    grammar = {r.name: r for r in map(Requirement, extras["grammar"])}
    assert set(grammar) == {"llguidance"} and serve["llguidance"].specifier == grammar["llguidance"].specifier
    assert "'edgespec[serve]'" in INSTALL
