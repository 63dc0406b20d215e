"""What a graph file has been measured to do on this machine, remembered beside the file's digest.

Some properties of a graph are facts about the kernels that run it, not about its bytes: whether the
target's prefill graph gives the same bits in one forward or in two (runtime/engine/probes.py
`prefill_chunks_exact`, 1.0 s on the int4 1.5B) depends on ONNX Runtime's version, the CPU's
instruction set and the thread count. `remembered` keeps such a verdict in the digest memory
(edgespec/hashing.py: <edgespec cache>/digests.json), under a name that holds all three, for the file
as it is now: any write to the file, another ORT, another CPU or another thread count measures again.
"""
from __future__ import annotations

import hashlib
import platform
from functools import lru_cache
from pathlib import Path
from typing import Callable

from edgespec.hashing import DigestMemory


@lru_cache(maxsize=1)
def cpu_signature() -> str:
    """The CPU's model and instruction-set flags (Linux), else what `platform` says; hashed."""
    text = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
        model = next((ln for ln in lines if ln.startswith(("model name", "Processor", "CPU part"))), "")
        flags = next((ln for ln in lines if ln.startswith(("flags", "Features"))), "")
        text = model + "|" + " ".join(sorted(flags.split(":", 1)[-1].split()))
    except OSError:
        pass
    text = text or f"{platform.machine()}|{platform.processor()}"
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def verdict_name(what: str, threads: int | None) -> str:
    import onnxruntime as ort  # lazy, as everywhere in the runtime

    return f"{what}/ort-{ort.__version__}/cpu-{cpu_signature()}/threads-{threads}"


def remembered(path: str | Path, what: str, threads: int | None, measure: Callable[[], bool]) -> bool:
    """measure()'s verdict for the file at `path` on this machine, measured once and then remembered.
    An unreadable or unwritable record only means measuring again."""
    memory = DigestMemory()
    name = verdict_name(what, threads)
    try:
        memory.sha256(path)                 # the record keys verdicts by the file's identity
    except OSError:
        return bool(measure())
    have = memory.known(path, name)
    if isinstance(have, bool):
        return have
    value = bool(measure())
    memory.derived(path, name, lambda: value)
    memory.save()
    return value
