"""Threads chosen where the bundle runs (runtime/engine/sessions.py, runtime/planning/device_profile.py): the allowed
physical cores (affinity, SMT siblings once, a cgroup quota), a pinned count capped to them in one line,
the profile's thread scaling and the decoder's sessions made at its choice."""
import dataclasses
import os

import pytest

from edgespec.errors import EPError
from edgespec.runtime import Bundle, SpeculativeDecoder
from edgespec.runtime.planning import device_profile as dp
from edgespec.runtime.engine import sessions
from edgespec.runtime.engine import thread_scaling as ts
from edgespec.runtime.planning.plan import make_plan

PROMPT = "def add(a, b):\n    return a + b\n\nclass Stack:\n    def push(self, item):"


def _sysfs(root, siblings: dict[int, tuple[int, int]]):
    """A sysfs cpu tree: {cpu: (package, core)}."""
    for cpu, (pkg, core) in siblings.items():
        top = root / f"cpu{cpu}" / "topology"
        top.mkdir(parents=True)
        (top / "physical_package_id").write_text(f"{pkg}\n")
        (top / "core_id").write_text(f"{core}\n")
    return root


def test_physical_cores_of_the_affinity_capped_by_a_quota(tmp_path):
    # 8 logical CPUs, 4 cores with 2 SMT threads each
    sys_cpu = _sysfs(tmp_path / "cpu", {c: (0, c // 2) for c in range(8)})
    none = tmp_path / "no-cgroup"
    assert sessions.allowed_cores(range(8), sys_cpu, none) == 4
    assert sessions.allowed_cores([0, 1], sys_cpu, none) == 1            # taskset on one core's two threads
    assert sessions.allowed_cores([0, 2, 4], sys_cpu, none) == 3
    v2 = tmp_path / "v2"
    v2.mkdir()
    (v2 / "cpu.max").write_text("150000 100000\n")                      # docker --cpus=1.5
    assert sessions.allowed_cores(range(8), sys_cpu, v2) == 2
    (v2 / "cpu.max").write_text("max 100000\n")
    assert sessions.allowed_cores(range(8), sys_cpu, v2) == 4
    v1 = tmp_path / "v1" / "cpu"
    v1.mkdir(parents=True)
    (v1 / "cpu.cfs_quota_us").write_text("100000\n")
    (v1 / "cpu.cfs_period_us").write_text("100000\n")
    assert sessions.allowed_cores(range(8), sys_cpu, v1.parent) == 1
    (v1 / "cpu.cfs_quota_us").write_text("-1\n")
    assert sessions.allowed_cores(range(8), sys_cpu, v1.parent) == 4
    assert sessions.allowed_cores([5, 9], tmp_path / "nothing", none) == 2    # no topology: each CPU a core


def test_this_process(monkeypatch):
    assert 1 <= sessions.allowed_cores() <= len(os.sched_getaffinity(0))
    assert sessions.default_threads() == sessions.allowed_cores()
    assert sessions.resolve_threads(None) == sessions.allowed_cores()


def test_more_threads_than_cores_are_capped_in_one_line(capsys, monkeypatch):
    monkeypatch.setattr(sessions, "allowed_cores", lambda: 2)
    monkeypatch.setattr(sessions, "_SAID", set())
    assert sessions.resolve_threads(64) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "threads=64 is more than the 2 core(s) this process may use: using 2" in err
    assert sessions.resolve_threads(64) == 2 and capsys.readouterr().err == ""     # said once
    assert sessions.resolve_threads(1) == 1
    for bad in (0, -1, 2.5, "2", True):
        with pytest.raises(EPError, match="threads must be a whole number"):
            sessions.resolve_threads(bad)


def test_scaling_stops_where_a_step_stops_getting_faster():
    assert sessions is not None and ts.thread_counts(1) == [1] and ts.thread_counts(16) == [1, 2, 4, 8, 16]
    assert ts.thread_counts(6) == [1, 2, 4, 6]
    asked = []

    def step(ms):
        return lambda n: asked.append(n) or ms[n]

    ms, best = ts.scale_threads(step({1: 100.0, 2: 55.0, 4: 31.0, 8: 30.5, 16: 20.0}), 16)
    assert best == 4 and asked == [1, 2, 4, 8] and list(ms) == [1, 2, 4, 8]     # 8 is < 3% faster: stop
    asked.clear()
    ms, best = ts.scale_threads(step({1: 100.0, 2: 120.0}), 2)
    assert best == 1 and asked == [1, 2]
    ms, best = ts.scale_threads(step({1: 10.0}), 1)
    assert best == 1 and ms == {1: 10.0}


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path / "home"))
    monkeypatch.setenv(dp.MODE_ENV, "cached")
    return tmp_path / "home"


def test_the_profile_measures_the_scaling_and_the_decoder_uses_its_choice(tiny_padded_bundle, home):
    bundle = Bundle.load(tiny_padded_bundle)
    profile, measured = dp.ensure_profile(bundle, threads=None)
    cores = sessions.allowed_cores()
    assert measured and profile.key["threads"] == "auto" and profile.key["cores"] == cores
    for side in ("target", "drafter"):
        counts = list(profile.thread_scaling[side])
        assert counts == ts.thread_counts(cores)[:len(counts)] and profile.chosen_threads(side) in counts
    assert dp.load_profile(bundle, threads=1) is None           # a pinned count is another profile
    again = dp.load_profile(bundle, threads=None)
    assert again == profile                                      # the scaling survives the cache
    with pytest.MonkeyPatch.context() as mp:                     # another core set (taskset, a container)
        mp.setattr(sessions, "allowed_cores", lambda: cores + 2)
        assert dp.load_profile(bundle, threads=None) is None
    # a profile that chose 1 thread for each side: the decoder's sessions are made with 1
    one = dataclasses.replace(profile, thread_scaling={"target": {1: 1.0, 2: 1.5}, "drafter": {1: 1.0, 2: 1.5},
                                                       "target_threads": 1, "drafter_threads": 1})
    dp.save_profile(one)
    plan = make_plan(one)
    assert (plan.threads, plan.draft_threads) == (1, 1) and any("target threads 1" in r for r in plan.reasons)
    dec = SpeculativeDecoder(bundle, strategy="tli", options={"defer_drafter": False})
    assert dec.shared.target_session_info.threads == 1 and dec.drafter.session_info.threads == 1
    ar = SpeculativeDecoder(bundle, strategy="ar", threads=2)                         # pinned: its own count
    assert ar.shared.target_session_info.threads == min(2, cores)
    assert dec.generate(PROMPT, max_new_tokens=12).token_ids == ar.generate(PROMPT, max_new_tokens=12).token_ids


def test_a_damaged_scaling_is_measured_again(tiny_padded_bundle, home, capsys):
    import json

    bundle = Bundle.load(tiny_padded_bundle)
    profile, _ = dp.ensure_profile(bundle, threads=None)
    path = dp.profile_path(profile.key)
    doc = json.loads(path.read_text())
    doc["thread_scaling"]["target_threads"] = 0
    path.write_text(json.dumps(doc))
    assert dp.load_profile(bundle, threads=None) is None
    assert "is damaged (bad thread_scaling); it is measured again" in capsys.readouterr().err


def test_a_profile_measured_beside_other_work_says_so(tiny_padded_bundle, home, monkeypatch, capsys):
    import subprocess
    import sys

    from edgespec.runtime.planning import device_plan

    busy = subprocess.Popen([sys.executable, "-c", "import time\nt = time.time()\nwhile time.time() - t < 3: pass"])
    try:
        assert ts.others_busy_now(0.5) >= 0.5                  # another process spins a core
    finally:
        busy.kill()
    bundle = Bundle.load(tiny_padded_bundle)
    profile, _ = dp.ensure_profile(bundle, threads=None)
    assert profile.others_busy_cores is not None and profile.others_busy_cores >= 0.0
    marked = dataclasses.replace(profile, others_busy_cores=ts.BUSY_CORES + 0.5)
    assert marked.measured_beside_others and not dataclasses.replace(profile, others_busy_cores=0.0).measured_beside_others
    assert dp.DeviceProfile.from_json(marked.to_json()) == marked
    # a decoder whose cached profile was measured beside other work measures it again once, when it is quieter
    dp.save_profile(marked)
    monkeypatch.setenv(dp.MODE_ENV, "auto")
    monkeypatch.setattr(device_plan, "others_busy_now", lambda: 0.0)          # the machine is quiet now
    dec = SpeculativeDecoder(bundle, strategy="auto")
    assert dec.planning.profile == marked
    dec.generate(PROMPT, max_new_tokens=4)
    dec.planning.wait()
    assert dec.planning.quiet_checked and dec.planning.remeasured
    assert "the device profile is measured again: other processes kept" in capsys.readouterr().err
    assert dp.load_profile(bundle, threads=None) == dec.planning.profile != marked
    # a machine that stays busy keeps the marked profile (no measurement beside the same load)
    dp.save_profile(marked)
    monkeypatch.setattr(device_plan, "others_busy_now", lambda: 1.5)
    busy_dec = SpeculativeDecoder(bundle, strategy="auto")
    busy_dec.generate(PROMPT, max_new_tokens=4)
    busy_dec.planning.wait()
    assert busy_dec.planning.quiet_checked and not busy_dec.planning.remeasured
    assert dp.load_profile(bundle, threads=None) == marked
