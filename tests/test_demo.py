"""`edgespec demo` end to end on the real smollm-self pair (int4), its reuse, and a real interruption."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

SMALL = ["--pair", "smollm-self", "--calib-tokens", "48", "--calib-new-tokens", "16", "--prompts", "1",
         "--max-new-tokens", "8", "--threads", "1"]
STEPS = ("pull", "export-target", "calibrate", "export", "bench")


def _demo(out, *extra) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "edgespec", "demo", *SMALL, "--out", str(out), *extra],
                          capture_output=True, text=True, timeout=1200)


def _ran(stderr: str) -> list[str]:
    """The steps a demo run executed (not reused), in order."""
    return [s for s in STEPS if f"[{s}] edgespec " in stderr]


@pytest.mark.real
def test_demo_smollm_self_int4_then_reused_then_an_interrupted_bench_resumes(tmp_path):
    out = tmp_path / "demo"
    first = _demo(out)
    assert first.returncode == 0, first.stderr[-3000:]
    assert _ran(first.stderr) == list(STEPS)
    m = json.loads((out / "bundle" / "manifest.json").read_text())
    assert m["target"]["graph"]["precision"] == "int4" and m["drafter"]["graph"]["precision"] == "int4"
    assert m["vocab"]["provenance"]["source"] == "target"                    # calibrated, not first-K
    engine = m["vocab"]["provenance"]["sources"]["target"]
    assert engine["engine"] == "BundleGenerator" and engine["graph"]["precision"] == "int4"   # ORT int4, not torch
    report = json.loads((out / "report" / "report.json").read_text())
    rows = {r["strategy"] for r in report["runs"]}
    assert {"ar", "auto"} <= rows and report["settings"]["split"] == "test"
    # an `ar-fast` row exactly where this CPU's exact plain steps pad (its kernels' 1-token path differs):
    # the device plan measured that here, whatever files the bundle has
    assert ("ar-fast" in rows) == (report["device_plan"]["step_tokens"] >= 2)
    assert report["runs"][0]["draft_length_setting"] in (0, "auto")
    assert "quality" not in m["target"]["quantization"]          # the fp32 reference is not built by default
    for text in ("decode tok/s", "(baseline)", "where the time went", "Greedy outputs identical to ar", "plot:",
                 "int4 target against its fp32 graph: not checked"):
        assert text in first.stdout, text

    t0 = time.time()
    second = _demo(out)
    assert second.returncode == 0 and _ran(second.stderr) == [] and time.time() - t0 < 15
    summary = [line for line in first.stdout.splitlines() if line.startswith("edgespec demo: pair smollm-self")]
    assert summary and summary[0] in second.stdout.splitlines()                # the same report, printed again

    # a real interruption: the demo is killed (its whole process group) once the bench has started
    proc = subprocess.Popen([sys.executable, "-m", "edgespec", "demo", *SMALL, "--out", str(out), "--remeasure"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    state = out / "demo-state.json"
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        if "started_key" in json.loads(state.read_text()).get("bench", {}):
            break
        time.sleep(0.05)
    assert proc.poll() is None, "the bench finished before it could be interrupted"
    time.sleep(1.0)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert "key" not in json.loads(state.read_text())["bench"]               # recorded as unfinished
    resumed = _demo(out)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert _ran(resumed.stderr) == ["bench"]                                  # only the unfinished step
    assert "decode tok/s" in resumed.stdout
