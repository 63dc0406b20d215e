"""What this machine does with a bundle's graphs, measured once where the bundle runs (issue 37).

Whether a quantized graph's 1-token forward computes what a wider forward computes at the same
position, and what a k-token forward costs, are facts about the CPU's kernels, not about the bundle:
the int4 Qwen2.5-Coder 1.5B's padded-attention graph is exact on a 2-core AVX-512 VNNI Xeon and off by
0.58 on a 2-core AVX2 EPYC without VNNI (2026-11-27). So the runtime measures them here:

- for each target graph variant (`model`: model.onnx; `padded_attention`: export/padded_attention.py;
  `prefill`: export/prefill_graph.py, fp32 compute): after a PREFIX-token prefill, TAIL 1-token
  forwards, then forwards of k tokens for k = 2..TAIL from the same place (SWEEPS times up to k = 5).
  `one_token_exact`: each 1-token forward's logits equal the same position's inside every wider forward
  (bitwise); `wide_exact`: forwards of 2+ tokens agree with each other; `cost_ms[k-1]`: a k-token
  forward, the fastest of its samples (other processes only ever add time), made non-decreasing in k
  (a forward never costs less than a shorter one: what a noisy sample says otherwise is noise). A variant is measured only while it can change the plan: the
  padded-attention graph first (the runtime's graph); model.onnx where that one is not exact here; the
  prefill graph where no graph has exact 1-token steps, and only as far as its first 1-token forwards
  when those are already slower than the padded step it would replace;
- the drafter's 1-token step (`drafter_step_ms`);
- with `threads=None`, how a 1-token target step and a drafter step scale with intra-op threads
  (`thread_scaling`): 1, 2, 4, ... up to the allowed physical cores (sessions.allowed_cores), stopping
  once a count is not SCALING_GAIN faster than the best before it; each side runs at its fastest count,
  and the rest of the profile is measured at the target's.

`ensure_profile` reads the profile from <edgespec cache>/profiles/, or measures and writes it there.
Its key holds the bundle's graph digests (the manifest's sha256 of each target graph and the drafter's),
ONNX Runtime's version, the CPU signature (runtime/engine/verdicts.py), the thread setting ("auto" or a pinned
count), the allowed cores and the EP (a GPU's profile plans its decoders as the CPU's plans theirs), and
is both the
file's name and part of its content: a profile of another bundle, ORT, CPU or thread count is never
read, and a damaged one is measured again, saying so in one line. runtime/planning/plan.py turns a profile into
a plan; `edgespec doctor` prints both.
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from edgespec import jsonio
from edgespec.errors import BundleError
from edgespec.paths import cache_home
from edgespec.runtime.engine.thread_scaling import (BUSY_CORES, cpu_seconds, others_busy, probe_step, scale_threads,
                                             session_threads, thread_counts)
from edgespec.runtime.engine.verdicts import cpu_signature

VERSION = 1
PREFIX = 16            # prefilled positions before the probe
TAIL = 9               # probed forwards of k = 1..TAIL tokens (the verify widths of gamma <= 8)
DRAFTER_STEPS = 6      # the drafter's 1-token steps timed (the first is not counted)
SWEEPS = 2             # samples of each k-token forward up to RESAMPLED tokens (one beyond: the plan's
RESAMPLED = 5          # gamma choices turn on the short ones)
GRAPHS = ("padded_attention", "model", "prefill")     # measuring order
# the prompt the probe feeds (a code-and-prose mix, tokenized by the target's tokenizer)
PROBE_TEXT = ("def merge(a, b):\n    \"\"\"Merge two sorted lists into one sorted list.\"\"\"\n    out = []\n"
              "    i = j = 0\n    while i < len(a) and j < len(b):\n")
MODE_ENV = "EDGESPEC_DEVICE_PROFILE"   # auto (default) | cached | off: see `profile_mode`


@dataclass
class GraphProfile:
    """One target graph variant on this machine (module docstring)."""
    measured: bool = False
    one_token_exact: bool | None = None
    wide_exact: bool | None = None
    one_token_max_abs_diff: float | None = None
    wide_max_abs_diff: float | None = None
    cost_ms: list[float] = field(default_factory=list)       # index k-1: a k-token forward
    note: str = ""

    def step_ms(self) -> float | None:
        """An exact plain step's cost on this graph: a 1-token forward, or a 2-token one where 1-token
        forwards are not exact (runtime/engine/kv.py pads them); None where unknown or no step is exact."""
        if not self.measured or not self.wide_exact and not self.one_token_exact:
            return None
        k = 1 if self.one_token_exact else 2
        return self.cost_ms[k - 1] if len(self.cost_ms) >= k else None


@dataclass
class DeviceProfile:
    key: dict
    graphs: dict[str, GraphProfile]
    drafter_step_ms: float | None
    measure_s: float
    measured_utc: str
    # threads=None: {"target": {threads: ms}, "drafter": {...}, "target_threads": n, "drafter_threads": m}
    thread_scaling: dict | None = None
    others_busy_cores: float | None = None   # cores other processes kept busy meanwhile, on average (Linux)

    @property
    def measured_beside_others(self) -> bool:
        """Whether other processes used BUSY_CORES or more while it was measured: its costs, and above all
        its thread choice, are those of a shared machine (device_plan.py measures it again once)."""
        return (self.others_busy_cores or 0.0) >= BUSY_CORES

    def chosen_threads(self, side: str) -> int | None:
        """The thread count the scaling chose for "target" or "drafter" (None: not measured)."""
        return (self.thread_scaling or {}).get(f"{side}_threads")

    def to_json(self) -> dict:
        return {"version": VERSION, **asdict(self)}

    @classmethod
    def from_json(cls, data: dict) -> "DeviceProfile":
        if not isinstance(data, dict) or data.get("version") != VERSION:
            raise ValueError("unknown version")
        graphs = {name: GraphProfile(**g) for name, g in data["graphs"].items()}
        for name, g in graphs.items():
            if name not in GRAPHS or not all(isinstance(c, (int, float)) and c > 0 for c in g.cost_ms):
                raise ValueError(f"bad graph entry {name!r}")
        step = data["drafter_step_ms"]
        if step is not None and not (isinstance(step, (int, float)) and step > 0):
            raise ValueError("bad drafter_step_ms")
        scaling = data.get("thread_scaling")
        if scaling is not None:
            scaling = {side: {int(t): float(ms) for t, ms in scaling[side].items()} if side in ("target", "drafter")
                       else int(scaling[side]) for side in scaling}
            if any(v < 1 for k, v in scaling.items() if k.endswith("_threads")):
                raise ValueError("bad thread_scaling")
        busy = data.get("others_busy_cores")
        return cls(key=dict(data["key"]), graphs=graphs, drafter_step_ms=step, measure_s=float(data["measure_s"]),
                   measured_utc=str(data["measured_utc"]), thread_scaling=scaling,
                   others_busy_cores=None if busy is None else float(busy))


def profile_mode() -> str:
    """$EDGESPEC_DEVICE_PROFILE: `auto` (default: a cached profile plans; without one the decoder measures
    it after its first generation), `cached` (plan from a cached profile, never measure), `off` (ignore
    profiles: the export's checks decide, as before 2026-11-27)."""
    mode = os.environ.get(MODE_ENV, "auto").strip().lower() or "auto"
    if mode not in ("auto", "cached", "off"):
        from edgespec.errors import GenerationError
        raise GenerationError(f"{MODE_ENV} must be auto, cached or off, got {mode!r}")
    return mode


def graph_paths(bundle) -> dict[str, Path]:
    """The target's graph variants this bundle has, by profile name."""
    t = bundle.target
    out = {"model": t.onnx}
    if t.padded_onnx is not None:
        out["padded_attention"] = t.padded_onnx
    if t.prefill_onnx is not None:
        out["prefill"] = t.prefill_onnx
    return out


def profile_key(bundle, threads: int | None, ep="cpu") -> dict:
    """What a profile is valid for: these graphs (their manifest digests), this ORT, CPU, thread setting and
    core count (a profile of `threads=None` chose its thread counts for this many cores)."""
    import onnxruntime as ort  # lazy, as everywhere in the runtime

    from edgespec.runtime.engine.sessions import allowed_cores, resolve_providers

    files = bundle.manifest.get("files") or {}
    paths = dict(graph_paths(bundle))
    if bundle.drafter is not None:
        paths["drafter"] = bundle.drafter.onnx
    digests = {}
    for name, path in sorted(paths.items()):
        rel = Path(path).relative_to(bundle.path).as_posix()
        digests[name] = (files.get(rel) or {}).get("sha256") or "?"
    return {"graphs": digests, "ort": ort.__version__, "cpu": cpu_signature(),
            "threads": "auto" if threads is None else int(threads), "cores": allowed_cores(),
            "ep": resolve_providers(ep)[0][0]}


def profile_path(key: dict) -> Path:
    name = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:24]
    return cache_home() / "profiles" / f"{name}.json"


def load_profile(bundle, threads: int | None, ep="cpu") -> DeviceProfile | None:
    """The cached profile for this bundle on this machine, None where there is none. A damaged one (or
    one whose key is not this one) is said in one line and ignored: it will be measured again."""
    key = profile_key(bundle, threads, ep)
    path = profile_path(key)
    if not path.is_file():
        return None
    try:
        profile = DeviceProfile.from_json(jsonio.loads(path.read_text(encoding="utf-8")))
        if profile.key != key:
            raise ValueError("its key is another bundle's or machine's")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        print(f"edgespec: the device profile {path} is damaged ({str(exc)[:80] or type(exc).__name__}); it is "
              "measured again", file=sys.stderr)
        return None
    return profile


def save_profile(profile: DeviceProfile) -> Path | None:
    """Write the profile atomically; None where the cache is not writable (the next run measures again)."""
    path = profile_path(profile.key)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(profile.to_json(), indent=1) + "\n", encoding="utf-8")
        os.replace(tmp, path)
    except OSError:
        return None
    return path


def probe_ids(bundle, n: int) -> list[int]:
    """n target ids: PROBE_TEXT's tokens, repeated as needed (ids the model sees in real text)."""
    ids = bundle.target.tokenizer.encode(PROBE_TEXT, add_special_tokens=False).ids or [1]
    return (ids * (n // len(ids) + 1))[:n]


def probe_graph(runner, ids: list[int], slower_than_ms: float | None = None) -> GraphProfile:
    """Exactness and the cost curve of one graph (module docstring), on a runner of its own (its cache is
    left empty). slower_than_ms: stop after the 1-token forwards when their median is above it."""
    tail = len(ids) - PREFIX
    runner.reset()
    runner.forward(ids[:PREFIX], last=1, pad=False)
    singles, single_ms = [], []
    for i in range(PREFIX, len(ids)):
        singles.append(runner.forward(ids[i:i + 1], pad=False)[0].copy())
        single_ms.append(runner.last_ms)
    step = float(min(single_ms[1:] or single_ms))
    if slower_than_ms is not None and step > slower_than_ms:
        runner.reset()
        return GraphProfile(measured=False, cost_ms=[round(step, 3)],
                            note=f"1-token forward {step:.1f} ms, slower than the {slower_than_ms:.1f} ms exact step "
                                 "it would replace: not measured further")
    one = np.stack(singles)
    wide, cost, repeats = {}, [step] + [float("inf")] * (tail - 1), True
    if runner.captures:                               # a width's first captured step is checked and captured
        for k in range(2, tail + 1):                  # (kv_static.py): not a cost, so not timed
            runner.crop(PREFIX)
            runner.forward(ids[PREFIX:PREFIX + k], pad=False)
    for sweep in range(SWEEPS):
        for k in range(2, tail + 1 if sweep == 0 else min(tail, RESAMPLED) + 1):
            runner.crop(PREFIX)
            logits = runner.forward(ids[PREFIX:PREFIX + k], pad=False)
            cost[k - 1] = min(cost[k - 1], runner.last_ms)
            if sweep == 0:
                wide[k] = logits.copy()
            else:                                              # the same forward again: the same bits?
                repeats = repeats and bool(np.array_equal(logits, wide[k]))
    runner.reset()
    cost = [min(cost[k:]) for k in range(tail)]      # non-decreasing in k (module docstring)
    full = wide[tail]
    d_one = max(float(np.abs(w - one[:k]).max()) for k, w in wide.items())
    d_wide = max(float(np.abs(w - full[:k]).max()) for k, w in wide.items())
    return GraphProfile(measured=True, one_token_exact=repeats and d_one == 0.0, wide_exact=repeats and d_wide == 0.0,
                        one_token_max_abs_diff=d_one, wide_max_abs_diff=d_wide, cost_ms=[round(c, 3) for c in cost],
                        note="" if repeats else "a forward repeated on the same input gave other logits here")


def measure_profile(bundle, threads: int | None, sessions: dict | None = None, drafter_session=None,
                    ep="cpu") -> DeviceProfile:
    """Measure this machine's profile of `bundle` on `ep` (module docstring; on another EP than the CPU's the
    threads are not scaled and the prefill graph, a CPU graph, is left out). `sessions`: {graph path: ORT
    session} already built (the decoder's), reused where their thread count is the one measured; other
    graphs and counts get sessions of their own, freed after."""
    from edgespec.runtime.engine.kv import ModelRunner
    from edgespec.runtime.engine.kv_static import STATIC_LENGTH, captures
    from edgespec.runtime.engine.sessions import allowed_cores, create_session, is_cpu_only, resolve_threads

    t0, cpu0 = time.perf_counter(), cpu_seconds()
    built = {(Path(p), session_threads(s)): s for p, s in (sessions or {}).items()}
    if drafter_session is not None and bundle.drafter is not None:
        built[(Path(bundle.drafter.onnx), session_threads(drafter_session))] = drafter_session
    ids = probe_ids(bundle, PREFIX + TAIL)
    paths = graph_paths(bundle)
    cpu = is_cpu_only(ep)
    if not cpu:
        paths.pop("prefill", None)
    dids = None
    if bundle.drafter is not None:
        dids = bundle.drafter.tokenizer.encode(PROBE_TEXT, add_special_tokens=False).ids or [1]
        dids = (dids * (PREFIX + DRAFTER_STEPS))[:PREFIX + DRAFTER_STEPS]

    def runner_at(path, n: int, role: str):
        sess = built.get((Path(path), n))
        if sess is None:
            # with CUDA graphs on the CUDA EP, as a decoder's default (`cuda_graph` "auto") runs its steps
            sess = built[(Path(path), n)] = create_session(path, ep, threads=n, role=role, graph_capture=True)[0]
        side = "target" if role == "target" else "drafter"
        # a session that captures CUDA graphs (the decoder's target on CUDA) is measured as it runs: captured
        return ModelRunner(sess, side, (bundle.target if side == "target" else bundle.drafter).max_position,
                           exact=False, static_length=STATIC_LENGTH if captures(sess) else None)

    graphs: dict[str, GraphProfile] = {}

    def loads(name: str, n: int) -> bool:
        """Whether ORT loads target graph `name` here (its session, built now, is reused). One it cannot load
        is profiled as such, so that it is not tried again at every run; model.onnx must load."""
        try:
            runner_at(paths[name], n, "target")
            return True
        except BundleError as exc:
            if name == "model":         # the bundle's own graph: nothing to fall back on
                raise
            graphs[name] = GraphProfile(note=f"cannot be loaded here: {str(exc)[:160]}")
            paths.pop(name)
            return False

    scaling, given = None, set(built)
    target_n = drafter_n = resolve_threads(threads)
    if threads is None and cpu:
        cores = allowed_cores()
        first = next(paths[n] for n in GRAPHS if n in paths and loads(n, thread_counts(cores)[0]))
        target_ms, target_n = scale_threads(lambda n: probe_step(runner_at(first, n, "target"), ids, PREFIX), cores)
        scaling = {"target": target_ms, "target_threads": target_n}
        if dids is not None:
            drafter_ms, drafter_n = scale_threads(
                lambda n: probe_step(runner_at(bundle.drafter.onnx, n, "drafter"), dids, PREFIX), cores)
            scaling.update(drafter=drafter_ms, drafter_threads=drafter_n)
        # free the sessions of counts not chosen (a 1.5B int4 target's is about 1 GB)
        built = {key: s for key, s in built.items() if key in given or key[1] in (target_n, drafter_n)}
    for name in GRAPHS:
        if name not in paths:
            continue
        best = min((s for s in (g.step_ms() for g in graphs.values()) if s is not None), default=None)
        exact_one = any(g.one_token_exact and g.wide_exact for g in graphs.values())
        if name == "model" and graphs.get("padded_attention") and graphs["padded_attention"].one_token_exact \
                and graphs["padded_attention"].wide_exact:
            graphs[name] = GraphProfile(note="not measured: the padded-attention graph is exact here")
            continue
        if name == "prefill" and exact_one:
            graphs[name] = GraphProfile(note="not measured: another graph has exact 1-token steps here")
            continue
        if loads(name, target_n):
            graphs[name] = probe_graph(runner_at(paths[name], target_n, "target"), ids,
                                       slower_than_ms=best if name == "prefill" else None)
    drafter_ms = None
    if dids is not None:
        drafter_ms = probe_step(runner_at(bundle.drafter.onnx, drafter_n, "drafter"), dids, PREFIX, DRAFTER_STEPS)
    wall = time.perf_counter() - t0
    others = others_busy(cpu0, cpu_seconds(), wall)
    return DeviceProfile(key=profile_key(bundle, threads, ep), graphs=graphs, drafter_step_ms=drafter_ms,
                         measure_s=round(wall, 3), measured_utc=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                         thread_scaling=scaling, others_busy_cores=None if others is None else round(others, 3))


def ensure_profile(bundle, threads: int | None, remeasure: bool = False, ep="cpu",
                   **measure_kw) -> tuple[DeviceProfile, bool]:
    """(this machine's profile of `bundle` on `ep`, whether it was measured now): the cached one, else
    measured and cached."""
    profile = None if remeasure else load_profile(bundle, threads, ep)
    if profile is not None:
        return profile, False
    profile = measure_profile(bundle, threads, ep=ep, **measure_kw)
    save_profile(profile)
    return profile, True


def plan_for(bundle, threads: int | None, ep="cpu", graph: str | None = None, acceptance: float | None = None):
    """(the cached profile or None, the plan): runtime/planning/plan.py's `make_plan` on this machine's cached
    profile for `ep`; the export's plan without one or with $EDGESPEC_DEVICE_PROFILE=off. Measures
    nothing. `graph`: plan on that graph variant only (a decoder whose target session is made)."""
    from edgespec.runtime.planning.plan import export_plan, make_plan

    profile = None
    if profile_mode() != "off":
        profile = load_profile(bundle, threads, ep)
    if profile is None:
        t = bundle.target
        from edgespec.runtime.engine.sessions import is_cpu_only

        return None, export_plan(t.padded_exact_at_export, int(t.info.get("min_forward_tokens") or 1),
                                 t.padded_onnx is not None, cpu=is_cpu_only(ep))
    return profile, make_plan(profile, acceptance, graph=graph)


def device_plan_summary(bundle, threads: int | None, ep="cpu", progress: bool = True) -> dict:
    """For a benchmark: this machine's profile on `ep` (measured now where none is cached and
    $EDGESPEC_DEVICE_PROFILE is not off) and the plan the decoders will make from it, as a report entry."""
    measured = False
    if profile_mode() != "off" and load_profile(bundle, threads, ep) is None:
        profile, measured = ensure_profile(bundle, threads, ep=ep)
        if progress:
            print(f"edgespec: device profile measured in {profile.measure_s:.2f} s (once per machine)", file=sys.stderr)
    profile, plan = plan_for(bundle, threads, ep)
    return {"plan": plan.describe(), "step_graph": plan.step_graph, "step_tokens": plan.step_tokens,
            "drafter": plan.drafter, "gamma_max": plan.gamma_max, "plain_steps": plan.plain_steps,
            "reasons": list(plan.reasons),
            "profile": None if profile is None else profile.to_json(), "profile_measured_now": measured}
