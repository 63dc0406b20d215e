"""How a step scales with intra-op threads, and how busy other processes keep the machine: the parts of
the device profile (runtime/planning/device_profile.py) that are about the CPU rather than the bundle.

`scale_threads` times a 1-token step at 1, 2, 4, ... threads up to the allowed physical cores
(sessions.allowed_cores) and stops at the first count that is not SCALING_GAIN faster than the best
fewer threads gave: more threads than pay only contend (and on a shared machine they lose outright).
`cpu_seconds` and `others_busy_now` read /proc/stat: a profile measured while other processes kept
BUSY_CORES busy is marked, and measured again when the machine is quieter (runtime/planning/device_plan.py).
"""
from __future__ import annotations

import os
import time
from pathlib import Path

SCALING_STEPS = 5      # 1-token steps timed at each thread count (the first is not counted)
SCALING_GAIN = 0.03    # a thread count must be this much faster than the best fewer threads gave
BUSY_CORES = 0.5       # other processes' average use of the cores, while measuring, that marks a profile


def thread_counts(cores: int) -> list[int]:
    """The thread counts the scaling tries: 1, 2, 4, ... below `cores`, then `cores`."""
    counts, t = [], 1
    while t < cores:
        counts.append(t)
        t *= 2
    return counts + [cores]


def probe_step(runner, ids: list[int], prefix: int, steps: int = SCALING_STEPS) -> float:
    """The fastest of `steps` - 1 1-token forwards after a `prefix`-token prefill (the runner left empty)."""
    runner.reset()
    runner.forward(ids[:prefix], last=1, pad=False)
    ms = []
    for i in range(prefix, prefix + steps):
        runner.forward(ids[i:i + 1], last=1, pad=False)
        ms.append(runner.last_ms)
    runner.reset()
    return round(float(min(ms[1:])), 3)


def scale_threads(step_ms_at, cores: int) -> tuple[dict[int, float], int]:
    """({threads: ms of a step}, the fastest count): counts from thread_counts, stopping at the first that is
    not SCALING_GAIN faster than the best fewer threads gave (more threads than pay only contend)."""
    ms: dict[int, float] = {}
    best = None
    for t in thread_counts(cores):
        ms[t] = step_ms_at(t)
        if best is not None and ms[t] > ms[best] * (1.0 - SCALING_GAIN):
            break
        best = t
    return ms, best


def others_busy_now(window_s: float = 0.1) -> float | None:
    """Cores other processes keep busy now, on average over `window_s` (None where it cannot be read)."""
    c0, t0 = cpu_seconds(), time.perf_counter()
    time.sleep(window_s)
    return others_busy(c0, cpu_seconds(), time.perf_counter() - t0)


def others_busy(before, after, wall_s: float) -> float | None:
    """Cores other processes kept busy between two `cpu_seconds()` readings `wall_s` apart, on average."""
    if before is None or after is None:
        return None
    return max(0.0, (after[0] - before[0]) - (after[1] - before[1])) / max(wall_s, 1e-6)


def cpu_seconds() -> tuple[float, float] | None:
    """(CPU seconds the whole machine has been busy, those of this process) on Linux; None elsewhere."""
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        tick = os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, AttributeError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)           # idle + iowait
    busy = (sum(fields[:8]) - idle) / tick                              # guest time is inside user time
    own = os.times()
    return busy, own.user + own.system


def session_threads(session) -> int:
    """A session's intra-op thread count."""
    return int(session.get_session_options().intra_op_num_threads)
