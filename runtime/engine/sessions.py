"""ONNX Runtime sessions: execution-provider (EP) selection, the check that the EP is really active,
and thread defaults for this class of machine.

EP names: `cpu`, `cuda`, `tensorrt`, `dml`, `qnn`, `openvino`, `coreml`, `rocm`, a full ORT provider
name (`"CUDAExecutionProvider"`), or an explicit list of names / `(name, options)` pairs in priority
order. ORT appends the CPU EP itself, so `cuda` means "CUDA, with CPU for unsupported nodes".

Why the check: onnxruntime-gpu lists CUDA/TensorRT in `get_available_providers()` even on machines
without a GPU, and a session asked for CUDA then silently runs on CPU (docs/facts.md). After creating a
session we compare `session.get_providers()` with the request: if the first requested EP is not
active we raise EPError naming what is active and what this build offers, unless
`allow_fallback=True`, in which case we warn and record the fallback (it ends up in the stats).

Threads (docs/runtime.md, "Threads"; docs/fast-path.md): min(cores, 4) intra-op threads that spin
while a run lasts. The drafter's stop spinning when its run returns (`session.force_spinning_stop`):
with ORT's default (spinning that goes on after the run) on both sessions the idle session's threads
steal the cores from the other, and spinning off costs a thread wake-up per node. A target with no
drafter session beside it (`ar`, `ngram`, a target-only bundle, `auto` where the device plan starts
without the drafter) keeps ORT's default, so that its next run (the next plain step) starts on awake
threads; with a drafter beside it the target stops too, or its spinning slows the drafter's steps. The
figures: docs/results.md.
`threads=None` means every core this process may use (`allowed_cores`: its CPU affinity, SMT siblings
counted once, a cgroup CPU quota), as onnxruntime-genai does, until this machine's device profile has
measured how a step scales with threads and chosen fewer (runtime/planning/device_profile.py, `thread_scaling`).
An explicit `threads=n` uses n threads: a whole number from 1 to MAX_THREADS (`check_threads`; anything
else, 2.7, 0, "2", True, is a one-line EPError), and more than the allowed cores are capped to them, said
in one line (`resolve_threads`).
"""
from __future__ import annotations

import contextlib
import io
import linecache
import numbers
import os
import sys
import threading
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from edgespec.errors import BundleError, EPError, GenerationError, first_line
from edgespec.runtime.engine.kv import AUTO_PREFILL_GRAPH_TOKENS, PREFILL_GRAPH_TOKENS
from edgespec.runtime.engine.placement import RECORD_KEY

EP_ALIASES = {
    "cpu": "CPUExecutionProvider",
    "cuda": "CUDAExecutionProvider",
    "tensorrt": "TensorrtExecutionProvider",
    "dml": "DmlExecutionProvider",
    "qnn": "QNNExecutionProvider",
    "openvino": "OpenVINOExecutionProvider",
    "coreml": "CoreMLExecutionProvider",
    "rocm": "ROCMExecutionProvider",
}
CPU = "CPUExecutionProvider"
MAX_THREADS = 1024
# ORT log severities: 0 verbose, 1 info, 2 warning, 3 error, 4 fatal.
QUIET = 3          # default: hide ORT's warnings (e.g. "some nodes were not assigned to the preferred EP")
SILENT = 4         # while creating a non-CPU session: hides the "Failed to load libonnxruntime_providers_cuda"
                   # error, which is logged at severity 3; we detect the failure ourselves via get_providers().


def _ort():
    import onnxruntime as ort  # lazy: importing the runtime (and `edgespec --help`) needs no onnxruntime

    return ort


def run_errors() -> tuple[type, ...]:
    """What a failed ORT run raises (an op's own check, memory, a damaged graph): RuntimeError ("Error in
    execution") and ORT's own exception types, which the decoder turns into one line."""
    import onnxruntime.capi.onnxruntime_pybind11_state as state

    return (RuntimeError, state.Fail, state.RuntimeException, state.InvalidArgument, state.EPFail)


def known_provider_names() -> list[str]:
    """Every provider name this onnxruntime build knows about (whether or not it can load)."""
    ort = _ort()
    try:
        return list(ort.get_all_providers())
    except AttributeError:  # very old builds
        return list(ort.get_available_providers())


def resolve_providers(ep: str | Sequence[Any] | None) -> list[tuple[str, dict]]:
    """EP request -> [(ORT provider name, options)] in priority order. Raises EPError on unknown names."""
    if ep is None:
        ep = "cpu"
    items = [ep] if isinstance(ep, str) else list(ep)
    if not items:
        raise EPError("empty execution-provider list")
    out: list[tuple[str, dict]] = []
    for item in items:
        opts: dict = {}
        if isinstance(item, (tuple, list)) and len(item) == 2 and isinstance(item[1], dict):
            item, opts = item
        if not isinstance(item, str):
            raise EPError(f"execution provider must be a name or (name, options), got {item!r}")
        name = EP_ALIASES.get(item.lower(), item)
        if name not in EP_ALIASES.values() and name not in known_provider_names():
            raise EPError(f"unknown execution provider {item!r}; use one of {', '.join(EP_ALIASES)} "
                          f"or an ORT provider name ({', '.join(known_provider_names())})")
        out.append((name, dict(opts)))
    return out


SYS_CPU = Path("/sys/devices/system/cpu")
CGROUP = Path("/sys/fs/cgroup")
_SAID: set = set()          # the capped-threads lines already printed (once each per process)


def allowed_cores(cpus: Sequence[int] | None = None, sys_cpu: Path = SYS_CPU, cgroup: Path = CGROUP) -> int:
    """Physical cores this process may run on: the CPUs of its affinity (`taskset`, a container's cpuset),
    SMT siblings counted once (a second hardware thread of a core shares its matmul units), capped by a
    cgroup CPU quota (`docker --cpus`). `cpus`, `sys_cpu`, `cgroup`: the affinity and the sysfs roots."""
    if cpus is None:
        try:
            cpus = sorted(os.sched_getaffinity(0))
        except (AttributeError, OSError):      # not Linux
            cpus = list(range(os.cpu_count() or 1))
    cores = {_core_of(c, sys_cpu) for c in cpus}
    quota = _cpu_quota(cgroup)
    return max(1, min(len(cores), quota) if quota else len(cores))


def _core_of(cpu: int, sys_cpu: Path):
    """(package, core) of a logical CPU; the CPU itself where sysfs does not say."""
    top = sys_cpu / f"cpu{cpu}" / "topology"
    try:
        return (top / "physical_package_id").read_text().strip(), (top / "core_id").read_text().strip()
    except OSError:
        return ("cpu", cpu)


def _cpu_quota(cgroup: Path) -> int | None:
    """Whole CPUs a cgroup quota allows (rounded up), None without one: v2's cpu.max, v1's cfs files."""
    try:
        quota, period = (cgroup / "cpu.max").read_text().split()[:2]
    except (OSError, ValueError):
        try:
            quota = (cgroup / "cpu" / "cpu.cfs_quota_us").read_text().strip()
            period = (cgroup / "cpu" / "cpu.cfs_period_us").read_text().strip()
        except OSError:
            return None
    try:
        q, p = int(quota), int(period)
    except ValueError:                      # "max": no quota
        return None
    return max(1, -(-q // p)) if q > 0 and p > 0 else None


def default_threads() -> int:
    """Intra-op threads used when `threads=None` and no device profile chose fewer: every allowed core."""
    return allowed_cores()


def resolve_threads(threads, name: str = "threads") -> int:
    """The intra-op threads a session gets: `threads` checked (check_threads), None the default, and more
    than the allowed cores capped to them with one line (once per process)."""
    n = check_threads(threads, name)
    cores = allowed_cores()
    if n is None:
        return cores
    if n > cores:
        if (name, n) not in _SAID:
            _SAID.add((name, n))
            print(f"edgespec: {name}={n} is more than the {cores} core(s) this process may use: using {cores}",
                  file=sys.stderr)
        return cores
    return n


def check_threads(threads, name: str = "threads") -> int | None:
    """`threads` as an int (None stays None: the default policy); EPError unless it is a whole number
    from 1 to MAX_THREADS (floats, strings and bools are refused, not rounded). `name` is the argument's
    name in the message (the decoder's `draft_threads`, say)."""
    if threads is None:
        return None
    if isinstance(threads, bool) or not isinstance(threads, numbers.Integral) or not 1 <= threads <= MAX_THREADS:
        shown = repr(threads) if len(repr(threads)) <= 40 else repr(threads)[:37] + "..."
        raise EPError(f"{name} must be a whole number from 1 to {MAX_THREADS} (or None for the default), got {shown}")
    return int(threads)


def session_options(threads: int | None = None, name: str = "threads", stop_spinning: bool = True):
    """SessionOptions with our thread policy: n intra-op threads that spin while a run lasts and, with
    stop_spinning, stop when it returns (`session.force_spinning_stop`), one inter-op thread."""
    ort = _ort()
    n = resolve_threads(threads, name)
    so = ort.SessionOptions()
    so.intra_op_num_threads = n
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.log_severity_level = SILENT   # a failed run's error log too: the decoder reports it in one line (run_errors)
    if n > 1:
        # Spinning between the ~300 nodes of a forward saves a thread wake-up per node (Qwen-0.5B int4
        # drafter: 13 vs 21 ms a step); stopping it when Run() returns keeps idle threads from stealing
        # the cores from the other session of the pair (docs/fast-path.md, "Threads").
        so.add_session_config_entry("session.intra_op.allow_spinning", "1")
        so.add_session_config_entry("session.force_spinning_stop", "1" if stop_spinning else "0")
        # Prepack the weights on the intra-op threads: the int4 1.5B + 0.5B pair's sessions build in
        # 1.55 s instead of 2.07 s (cold start, docs/runtime.md); older ORT ignores the key.
        so.add_session_config_entry("session.prepack.enable_parallel", "1")
    return so


@dataclass
class SessionInfo:
    """What was asked for and what ORT actually gave."""
    requested: list[str]
    active: list[str]
    threads: int
    fallback: str | None = None          # a one-line note when the requested EP is not active
    options: dict = field(default_factory=dict)


def create_session(model_path: str | Path, ep: str | Sequence[Any] | None = "cpu", threads: int | None = None,
                   allow_fallback: bool = False, role: str = "model", stop_spinning: bool = True,
                   graph_capture: bool = False):
    """(InferenceSession, SessionInfo). Raises EPError if the requested EP is not active (unless allow_fallback).
    graph_capture: on the CUDA EP, with CUDA graphs enabled (runtime/engine/kv_static.py); where ONNX
    Runtime refuses to capture the graph, one line quotes its reason and the session is made without."""
    if graph_capture and resolve_providers(ep)[0][0] == EP_ALIASES["cuda"]:
        try:
            return create_session(model_path, with_graph_capture(ep), threads, allow_fallback, role, stop_spinning)
        except EPError as exc:
            if not capture_refused(exc):
                raise
            warnings.warn(f"{role}: ONNX Runtime will not capture this graph's steps as CUDA graphs ({exc}); they "
                          "run uncaptured", RuntimeWarning, stacklevel=2)
    ort = _ort()
    providers = resolve_providers(ep)
    names = [n for n, _ in providers]
    only_cpu = all(n == CPU for n in names)
    so = session_options(threads, "threads" if role in ("model", "target") else f"{role} threads",
                         stop_spinning=stop_spinning)
    if not only_cpu:                # which EP runs each node (runtime/engine/placement.py: the KV layout's soundness)
        so.add_session_config_entry(RECORD_KEY, "1")
    available = list(ort.get_available_providers())
    if names[0] not in available and not allow_fallback:     # refuse before ORT warns and prints about it
        raise EPError(f"{role}: execution provider {names[0]} is not in this onnxruntime build (it offers "
                      f"{', '.join(available)}); install the onnxruntime package built for it, or pass "
                      "allow_fallback=True to run anyway")
    run_with = [(n, o) for n, o in providers if n in available] or [(CPU, {})]
    ort.set_default_logger_severity(QUIET if only_cpu else SILENT)
    try:
        # ORT *prints* (stdout) "EP Error ... Falling back" when a listed EP fails to load: we say it ourselves.
        with contextlib.redirect_stdout(io.StringIO()) if not only_cpu else contextlib.nullcontext():
            sess = ort.InferenceSession(str(model_path), sess_options=so, providers=run_with)
    except Exception as exc:  # ORT raises its own exception types (Fail, InvalidGraph, ...)
        first = first_line(exc)[:200]
        if "provider" in str(exc).lower() or not only_cpu:
            raise EPError(f"{role}: could not create a session with {names}: {first}") from exc
        raise BundleError(f"{role}: ONNX Runtime cannot load {model_path}: {first}") from exc
    finally:
        ort.set_default_logger_severity(QUIET)
    active = list(sess.get_providers())
    info = SessionInfo(requested=names, active=active, threads=so.intra_op_num_threads,
                       options={n: o for n, o in providers if o})
    if names[0] not in active:
        msg = (f"{role}: requested execution provider {names[0]} is not active (session runs on "
               f"{', '.join(active)}); this onnxruntime build lists {', '.join(ort.get_available_providers())}, "
               "but a listed EP can still fail to load (missing driver/libraries)")
        if not allow_fallback:
            raise EPError(msg + "; pass allow_fallback=True to run anyway")
        info.fallback = f"{role}: {names[0]} -> {active[0]}"
        warnings.warn(msg + "; falling back", RuntimeWarning, stacklevel=3)
    return sess, info


def with_graph_capture(ep) -> list[tuple[str, dict]]:
    """`ep` with CUDA graphs enabled on its CUDA EP (provider option `enable_cuda_graph`;
    runtime/engine/kv_static.py)."""
    return [(n, {**o, "enable_cuda_graph": "1"} if n == EP_ALIASES["cuda"] else o) for n, o in resolve_providers(ep)]


def capture_refused(exc: Exception) -> bool:
    """Whether a session error is ONNX Runtime refusing CUDA graph capture for the graph (nodes left on
    another EP, Memcpy nodes, control flow)."""
    text = str(exc).lower()
    return "graph capture" in text or "cuda graph" in text


def is_cpu_only(ep) -> bool:
    """Whether `ep` (create_session's argument) asks for the CPU EP alone."""
    return all(n == CPU for n, _ in resolve_providers(ep))


def create_sessions(requests: Sequence[dict], beside: Callable[[], Any] | None = None) -> list[tuple]:
    """[create_session(**r) for r in requests], built concurrently when every request is for the CPU EP
    alone: ORT releases the GIL while it loads and prepacks a graph, so a pair's two sessions take about
    the time of the larger one (docs/runtime.md, "Cold start"). `beside()` runs on the calling thread
    meanwhile, once each build is inside ORT's session initialisation (so that Python work that holds
    the GIL, such as parsing a tokenizer, does not hold the builds up). Other EPs build one after
    another (their loading redirects stdout, which is process-wide), then `beside()` runs. Errors are
    create_session's, in request order, then beside()'s."""
    cpu_only = all(is_cpu_only(r.get("ep", "cpu")) for r in requests)
    if not cpu_only or (len(requests) < 2 and beside is None):
        made = [create_session(**r) for r in requests]
        if beside is not None:
            beside()
        return made
    results: list = [None] * len(requests)

    def build(i: int, request: dict) -> None:
        try:
            results[i] = (True, create_session(**request))
        except BaseException as exc:          # re-raised on the calling thread
            results[i] = (False, exc)

    threads = [threading.Thread(target=build, args=(i, r), name=f"edgespec-session-{i}", daemon=True)
               for i, r in enumerate(requests)]
    for t in threads:
        t.start()
    failed = None
    if beside is not None:
        _wait_inside_ort(threads)
        try:
            beside()
        except BaseException as exc:
            failed = exc
    for t in threads:
        t.join()
    for ok, value in results:
        if not ok:
            raise value
    if failed is not None:
        raise failed
    return [value for _, value in results]


def _wait_inside_ort(threads: Sequence[threading.Thread], limit_s: float = 0.25) -> None:
    """Until every thread is inside onnxruntime's `initialize_session` (graph optimisation and weight
    prepacking, nearly all of a build, run without the GIL), or has finished; at most limit_s. The model
    load before it needs the GIL back when it returns, so work begun then would hold the build up. Only
    timing depends on this: a miss costs the overlap, nothing else."""
    deadline = time.perf_counter() + limit_s
    while time.perf_counter() < deadline:
        frames = sys._current_frames()
        if all(not t.is_alive() or _in_session_init(frames.get(t.ident)) for t in threads):
            return
        time.sleep(0.001)


def _in_session_init(frame) -> bool:
    while frame is not None:
        if frame.f_code.co_name == "_create_inference_session":
            return "initialize_session(" in linecache.getline(frame.f_code.co_filename, frame.f_lineno)
        frame = frame.f_back
    return False


def prefill_graph_applies(bundle, ep) -> bool:
    """Whether `prefill_graph="auto"` uses a prefill graph: the bundle has one and `ep` is the CPU's."""
    return bundle.target.prefill_onnx is not None and is_cpu_only(ep)


def prefill_graph_request(bundle, setting, ep, target_request: dict, defer: bool) -> tuple:
    """(the prefill graph's session request or None, whether to build it now, the shortest prompt it
    takes). "auto": where the bundle has one and the EP is the CPU's, prompts of AUTO_PREFILL_GRAPH_TOKENS
    or more, built for the first (now with defer_drafter=False); True: required, built now, prompts of
    PREFILL_GRAPH_TOKENS or more; False: never (runtime/engine/kv.py)."""
    if setting != "auto" and not isinstance(setting, bool):
        raise GenerationError(f"prefill_graph must be 'auto', True or False, got {setting!r}")
    if not setting:
        return None, False, 0
    if not prefill_graph_applies(bundle, ep):
        if setting == "auto":
            return None, False, 0
        if bundle.target.prefill_onnx is None:
            raise GenerationError(f"bundle {bundle.path} has no prefill graph (target/prefill.onnx): only int4 "
                                  "and int8 CPU exports from 2026-11-26 on have one; re-export such a bundle, or "
                                  "run with prefill_graph='auto' or False (--prefill-graph auto|off)")
        raise GenerationError("prefill_graph is for the CPU EP (MatMulNBits' compute type there)")
    # its threads stop spinning after each prefill: the next run is always the main graph's
    request = dict(target_request, model_path=bundle.target.prefill_onnx, role="target prefill", stop_spinning=True)
    if setting is True:
        return request, True, PREFILL_GRAPH_TOKENS
    return request, not defer, AUTO_PREFILL_GRAPH_TOKENS
