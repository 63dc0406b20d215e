"""The engine a decoder runs on, built once: the target's ORT session (on the graph the device plan chose)
and its KV runner, the optional prefill graph, the drafter's session and runner (deferred to its first
forward on the CPU EP), the pair's token tables, all checked against the bundle and returned as one
`shared.Shared` (SpeculativeDecoder keeps it; its variants share it).
"""
from __future__ import annotations

import contextlib
from functools import partial

import numpy as np

from edgespec.errors import BundleError, GenerationError
from edgespec.runtime.bundle.chat import compile_template
from edgespec.runtime.round.context import drafter_context
from edgespec.runtime.planning.device_profile import graph_paths
from edgespec.runtime.engine.kv import DeferredRunner, ModelRunner
from edgespec.runtime.engine.kv_static import STATIC_LENGTH, captures
from edgespec.runtime.engine.sessions import CPU, create_session, create_sessions, is_cpu_only, prefill_graph_request
from edgespec.runtime.api.shared import Shared
from edgespec.runtime.engine.verdicts import remembered


def build_shared(bundle, plan, ep, threads: int | None, session: dict, with_drafter: bool, target_alone: bool,
                 prefill_graph: bool | str = "auto", allow_fallback: bool = False) -> Shared:
    """The sessions and runners of a decoder on `bundle` under the device `plan` (plan.Plan). `threads`:
    the caller's (None: the counts the plan's thread scaling chose); `session`: the session settings
    (config.SESSION_OPTIONS); `with_drafter`: build the drafter; `target_alone`: no drafter runs beside
    the target, so its threads keep spinning between steps (sessions.py)."""
    draft_ep, draft_threads, defer_drafter, store_mb = (session[k] for k in ("draft_ep", "draft_threads",
                                                                              "defer_drafter", "answer_store_mb"))
    if plan.step_graph == "prefill":
        prefill_graph = False              # the graph itself
    target_threads = threads if threads is not None else plan.threads
    if draft_threads is None:
        draft_threads = threads if threads is not None else plan.draft_threads
    # the steps as CUDA graphs on the CUDA EP (runtime/engine/kv_static.py), or their fixed buffers alone;
    # the drafter's too: uncaptured, a 0.5B step costs 0.75-0.79 of a 1.5B one on a GPU (kernel launches,
    # docs/gpu.md), and its proposals are only ever verified, so a capture can never cost a token
    capture, fixed_buffers = session["cuda_graph"] == "auto", session["cuda_graph"] == "static"
    target_request = dict(model_path=graph_paths(bundle)[plan.step_graph], ep=ep, threads=target_threads,
                          allow_fallback=allow_fallback, role="target", stop_spinning=not target_alone,
                          graph_capture=capture)
    prefill_request, prefill_now, prefill_from = prefill_graph_request(bundle, prefill_graph, ep, target_request,
                                                                       defer_drafter)
    requests = [target_request] + ([prefill_request] if prefill_now else [])
    drafter_request = None
    if with_drafter:
        drafter_request = dict(model_path=bundle.drafter.onnx, ep=ep if draft_ep is None else draft_ep,
                               threads=draft_threads, allow_fallback=allow_fallback, role="drafter",
                               graph_capture=capture)
    # The drafter's session waits for its first forward (kv.DeferredRunner) on the CPU EP; other EPs build
    # it now, so that an EP that fails to load says so here. Built now, a pair's two sessions are built at
    # the same time (create_sessions), and the text side is made ready meanwhile.
    defer = bool(drafter_request) and defer_drafter and is_cpu_only(drafter_request["ep"])
    sessions = create_sessions(requests + ([drafter_request] if drafter_request and not defer else []),
                               beside=lambda: _prepare_text(bundle))
    target_session, target_info = sessions.pop(0)
    prefill = sessions.pop(0)[0] if prefill_now else None
    later = (lambda: create_session(**prefill_request)[0]) if prefill_request and not prefill_now else None
    verdict = None if prefill_request is None else partial(remembered, bundle.target.prefill_onnx,
                                                           "prefill_chunks_exact", threads)
    # the plan's step width (its profile measured it here); on another EP the graph's declared width unless
    # the plan pads, and the runner's own probe may pad too (runtime/engine/probes.py)
    width = plan.step_tokens if is_cpu_only(ep) or plan.step_tokens >= 2 else None
    target = ModelRunner(target_session, "target", bundle.target.max_position, prefill_session=prefill,
                         prefill_factory=later, prefill_from=prefill_from, remember_chunks=verdict, min_tokens=width,
                         static_length=STATIC_LENGTH if fixed_buffers or captures(target_session) else None)
    check_runner(bundle, target, bundle.target.info, bundle.target.vocab_size, "target")
    if prefill is not None:
        target.check_prefill_chunks()
    drafter = text_context = None
    if with_drafter:
        if defer:
            drafter = DeferredRunner(lambda: drafter_runner(bundle, create_session(**drafter_request), fixed_buffers),
                                     bundle.drafter.max_position, [CPU])
        else:
            drafter = drafter_runner(bundle, sessions[0], fixed_buffers)
        text_context = drafter_context(bundle)          # token tables: built once per decoder
    return Shared(bundle, target, drafter, text_context, target_info, store_mb)


def check_runner(bundle, runner: ModelRunner, info: dict, width: int, role: str) -> None:
    """A graph whose logits width or layer count is not the manifest's: a one-line BundleError."""
    if isinstance(runner.vocab, int) and runner.vocab != width:
        raise BundleError(f"bundle {bundle.path}: {role} graph emits {runner.vocab} logits, manifest expects {width}")
    layers = info.get("num_layers")
    if layers and len(runner.past_names) != 2 * int(layers):
        raise BundleError(f"bundle {bundle.path}: {role} graph has {len(runner.past_names)} past inputs, "
                          f"manifest says {layers} layers")


def drafter_runner(bundle, made: tuple, fixed_buffers: bool = False) -> ModelRunner:
    """The drafter's runner over a created (session, SessionInfo), checked against the bundle (its
    `index_map` and `draft_ids` outputs against vocab/). Its steps run from fixed buffers where the
    session captures CUDA graphs or `fixed_buffers` asks (runtime/engine/kv_static.py)."""
    session, info = made
    runner = ModelRunner(session, "drafter", bundle.drafter.max_position, exact=False,
                         static_length=STATIC_LENGTH if fixed_buffers or captures(session) else None)
    runner.session_info = info
    check_runner(bundle, runner, bundle.drafter.info, bundle.kept, "drafter")
    names = [n for n in ("index_map", "draft_ids") if n in runner.extra_outputs]
    for name, arr in zip(names, runner.run_extra(names) if names else ()):
        if not np.array_equal(np.asarray(arr).reshape(-1), getattr(bundle, name)):
            raise BundleError(f"bundle {bundle.path}: the drafter graph's {name} differs from vocab/{name}.npy "
                              "(mismatched bundle)")
    return runner


def _prepare_text(bundle) -> None:
    """Parse the tokenizers a load left for first use, and compile the chat template (a template that
    does not compile fails at the first chat call, as before: plain prompts still work)."""
    for side in (bundle.target, bundle.drafter):
        if side is not None:
            side.tokenizer
    if bundle.target.chat_template:
        with contextlib.suppress(GenerationError):
            compile_template(bundle.target.chat_template)
