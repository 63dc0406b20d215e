"""A built wheel, installed into a fresh venv (no system site-packages), gives the torch-free runtime
and the `edgespec` command, and nothing else at top level (no `runtime`, `export` ... packages)."""
from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _run(cmd, cwd, timeout=900, env=None):
    r = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)
    return r.returncode, r.stdout + r.stderr


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    rc, log = _run([sys.executable, "-m", "build", "--wheel", "--outdir", str(out), str(ROOT)], cwd=out)
    if rc != 0:  # no package index for the isolated build env: build with this interpreter's setuptools
        rc, log = _run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--skip-dependency-check",
                        "--outdir", str(out), str(ROOT)], cwd=out)
    assert rc == 0, log[-3000:]
    wheels = list(out.glob("edgespec-*.whl"))
    assert len(wheels) == 1
    return wheels[0]


def test_wheel_contents(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"edgespec"}
    for sub in ("runtime", "export", "calibrate", "models"):
        assert f"edgespec/{sub}/__init__.py" in names
    assert "edgespec/runtime/bundle/bundle.py" in names and "edgespec/runtime/bundle/vocab.py" in names
    assert any(n.startswith("edgespec/models/") and n.endswith(".toml") for n in names)
    assert not any(n.startswith("tests/") for n in names)
    metadata = next(n for n in names if n.endswith(".dist-info/METADATA"))
    headers = zipfile.ZipFile(wheel).read(metadata).decode().split("\n\n")[0].splitlines()
    assert "License-Expression: Apache-2.0" in headers          # the SPDX form (PEP 639), not a License: text


def test_wheel_in_fresh_venv(wheel, tmp_path):
    venv = tmp_path / "venv"
    rc, log = _run([sys.executable, "-m", "venv", str(venv)], cwd=tmp_path)
    assert rc == 0, log
    py = venv / "bin" / "python"
    # Base dependencies come from the pip cache / the configured index; edgespec itself only from the wheel.
    rc, log = _run([str(py), "-m", "pip", "install", "--disable-pip-version-check", "-q", str(wheel)], cwd=tmp_path)
    if rc != 0 and ("No matching distribution" in log or "Could not find a version" in log):
        pytest.skip(f"no package index reachable for the base dependencies: {log.strip().splitlines()[-1]}")
    assert rc == 0, log[-3000:]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH",)}
    rc, log = _run([str(py), "-c", "import edgespec, sys; from edgespec.runtime import Bundle; "
                    "print(edgespec.__file__); "
                    "assert 'torch' not in sys.modules"], cwd=tmp_path, env=env)
    assert rc == 0, log
    assert str(venv) in log  # imported from the venv, not from the checkout
    rc, log = _run([str(venv / "bin" / "edgespec"), "--help"], cwd=tmp_path, env=env)
    assert rc == 0 and "usage: edgespec" in log, log
    for top in ("runtime", "export", "calibrate", "models"):
        rc, log = _run([str(py), "-c", f"import {top}"], cwd=tmp_path, env=env)
        assert rc != 0 and "ModuleNotFoundError" in log, f"`import {top}` should fail in the wheel install: {log}"
