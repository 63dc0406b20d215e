"""`edgespec doctor --bundle B`: this machine's device profile of a bundle, the
plan it makes, and why.

The first thing to run when edgespec is slower than hoped: it says what the
CPU is (model, the instruction-set extensions the int4 kernels use),
measures the profile where none is cached (runtime/planning/device_profile.py;
`--remeasure` measures again), prints each target graph's exactness and
k-token cost curve and the drafter's step, then the plan
(runtime/planning/plan.py) with its reasons. `--acceptance A` shows the
plan at another drafter acceptance (what a generation measures as it runs).
"""
from __future__ import annotations

import argparse
import json
import sys

from edgespec.runtime.planning.plan import GRAPH_WORDS, PRIOR_ACCEPTANCE, make_plan

FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "amx_int8", "asimd", "i8mm", "sve")


def register(subparsers) -> None:
    p = subparsers.add_parser("doctor", help="this machine's device profile of a bundle, and the plan it makes",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bundle", required=True, help="bundle directory")
    p.add_argument("--threads", type=int, help="ORT intra-op threads (default: the runtime's)")
    p.add_argument("--remeasure", action="store_true", help="measure the profile again even if one is cached")
    p.add_argument("--acceptance", type=float, help=f"drafter acceptance per draft position to plan for "
                                                    f"(default {PRIOR_ACCEPTANCE}, the prior)")
    p.add_argument("--json", action="store_true", help="print the profile and plan as JSON")
    p.set_defaults(func=run_doctor)


def cpu_description() -> str:
    """The CPU's model name, core count and the instruction-set extensions that decide int4 speed."""
    import os
    import platform
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                fields.setdefault(key.strip(), value.strip())       # the first processor's
    except OSError:
        pass
    model = fields.get("model name") or fields.get("Processor") or platform.processor() or platform.machine()
    flags = set((fields.get("flags") or fields.get("Features") or "").split())
    have = [f for f in FLAGS if f in flags]
    return f"{model}, {os.cpu_count()} cores, {' '.join(have) or 'none of ' + '/'.join(FLAGS)}"


def run_doctor(args) -> int:
    import onnxruntime as ort  # lazy, as everywhere in the runtime

    from edgespec.runtime.bundle.bundle import Bundle
    from edgespec.runtime.planning.device_profile import ensure_profile, profile_path
    from edgespec.runtime.engine.sessions import allowed_cores, check_threads

    threads = check_threads(args.threads)
    if args.acceptance is not None and not 0.0 <= args.acceptance <= 1.0:
        from edgespec.errors import GenerationError
        raise GenerationError(f"--acceptance must be in [0, 1], got {args.acceptance}")
    bundle = Bundle.load(args.bundle, verify="fast")
    if not args.json:
        print(f"machine: {cpu_description()}; onnxruntime {ort.__version__}; "
              f"{allowed_cores()} allowed core(s), threads {'chosen by the profile' if threads is None else threads}")
        print(f"bundle: {bundle.path} ({bundle.manifest.get('pair') or 'pair'})", flush=True)
    profile, measured = ensure_profile(bundle, threads, remeasure=args.remeasure)
    plan = make_plan(profile, args.acceptance)
    if args.json:
        print(json.dumps({"profile": profile.to_json(), "plan": {
            "describe": plan.describe(), "step_graph": plan.step_graph, "step_tokens": plan.step_tokens,
            "drafter": plan.drafter, "gamma_max": plan.gamma_max, "free_guess": plan.free_guess,
            "acceptance": plan.acceptance, "reasons": list(plan.reasons)}}, indent=1))
        return 0
    how = f"measured now in {profile.measure_s:.2f} s" if measured else \
        f"cached, measured {profile.measured_utc} in {profile.measure_s:.2f} s"
    print(f"device profile ({how}): {profile_path(profile.key)}")
    width = max(len(w) for w in GRAPH_WORDS.values())
    print(f"  {'graph':<{width}}  1-token exact  2+-token exact  ms per k-token forward, k = 1..9")
    for name, g in profile.graphs.items():
        word = GRAPH_WORDS.get(name, name)
        if not g.measured:
            print(f"  {word:<{width}}  {g.note}")
            continue
        curve = " ".join(f"{c:.1f}" for c in g.cost_ms)
        print(f"  {word:<{width}}  {_yes(g.one_token_exact, g.one_token_max_abs_diff):<13}  "
              f"{_yes(g.wide_exact, g.wide_max_abs_diff):<14}  {curve}")
    if profile.drafter_step_ms is not None:
        print(f"  drafter step: {profile.drafter_step_ms:.1f} ms")
    if profile.measured_beside_others:
        print(f"  note: other processes kept {profile.others_busy_cores:.1f} cores busy while it was measured: its "
              "costs and thread choice are a shared machine's (--remeasure when it is quiet)")
    for side in ("target", "drafter"):
        if profile.chosen_threads(side) is not None:
            steps = "  ".join(f"{n}: {ms:.1f}" for n, ms in sorted(profile.thread_scaling[side].items()))
            print(f"  {side} 1-token step ms by threads  {steps}  -> {profile.chosen_threads(side)} threads")
    print(plan.describe())
    print("why:")
    for reason in plan.reasons:
        print(f"  - {reason}")
    sys.stdout.flush()
    return 0


def _yes(flag, diff) -> str:
    return "yes" if flag else f"no ({diff:.2g})"
