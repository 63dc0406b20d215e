"""The machine a benchmark runs on: description, library versions, a NumPy stream-read bandwidth test
and peak-RSS tracking. Torch-free."""
from __future__ import annotations

import importlib.metadata
import os
import platform
import resource
import sys
import time

import numpy as np

BANDWIDTH_MB = 256
BANDWIDTH_ROUNDS = 5


def read_bandwidth(megabytes: int = BANDWIDTH_MB, rounds: int = BANDWIDTH_ROUNDS) -> dict | None:
    """Single-thread read bandwidth: the best of `rounds` full reductions (np.max) over an array of
    `megabytes` MiB, larger than any CPU cache. Returns {"gbs", "megabytes", "rounds", "method"} or None
    when disabled (megabytes <= 0). GB = 1e9 bytes."""
    if megabytes <= 0:
        return None
    a = np.ones(int(megabytes) * 2**20 // 8, dtype=np.float64)
    a.max()                                          # touch every page once before timing
    best = float("inf")
    for _ in range(max(1, rounds)):
        t0 = time.perf_counter()
        a.max()
        best = min(best, time.perf_counter() - t0)
    gbs = a.nbytes / best / 1e9
    del a
    return {"gbs": gbs, "megabytes": int(megabytes), "rounds": int(rounds),
            "method": "numpy float64 max-reduction, 1 thread, best of rounds"}


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _memory_gb() -> float | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9
    except (ValueError, OSError, AttributeError):
        return None


def machine_info() -> dict:
    return {"hostname": platform.node(), "platform": platform.platform(), "machine": platform.machine(),
            "cpu": _cpu_model(), "cores": os.cpu_count(), "memory_gb": _memory_gb(),
            "python": sys.version.split()[0]}


def versions() -> dict:
    out = {}
    for dist in ("edgespec", "onnxruntime-gpu", "onnxruntime", "numpy", "tokenizers", "tqdm", "matplotlib"):
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return out


# --------------------------------------------------------------------------- peak RSS

def _status_kb(field: str) -> int | None:
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return None


def reset_peak_rss() -> bool:
    """Reset the kernel's peak-RSS mark (Linux: write 5 to /proc/self/clear_refs). False if unsupported."""
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
            f.write("5")
        return True
    except OSError:
        return False


def peak_rss_mb() -> float:
    """Peak resident set size in MB since the last reset (VmHWM), else since the process started."""
    kb = _status_kb("VmHWM")
    if kb is None:
        kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss   # KiB on Linux
    return kb * 1024 / 1e6
