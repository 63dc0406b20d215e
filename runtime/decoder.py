"""`SpeculativeDecoder`: the decode loop over two ORT sessions (a target and a pruned drafter).

`_run` prefills, then repeats one round (rounds.speculative_round: draft -> one target forward ->
accept -> roll back) until a stop; text is streamed as valid UTF-8 deltas (text.py).

Stopping: EOS (any of the target's eos_ids; the EOS token is kept in token_ids, not in text), stop
strings (text ends before the stop string; token_ids end with the token that completed it),
max_new_tokens (never exceeded: a round drafts at most remaining - 1 tokens). A prompt that cannot
fit prompt + max_new_tokens in the target's context is refused before anything runs.

The decoder owns what outlives one generation: sessions, KV runners, token tables, per-round scratch
arrays and, for randomised drafting with concurrent_draft=True, one worker thread (closed by
`close()` or `with SpeculativeDecoder(...) as dec:`).
"""
from __future__ import annotations

import contextlib
import dataclasses
import time
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np

from edgespec.errors import BundleError, GenerationError
from edgespec.runtime.bundle import Bundle
from edgespec.runtime.checks import DEFAULT_MAX_NEW_TOKENS, check_generation_args
from edgespec.runtime.config import (DEFAULT_DRAFT_LENGTH, DEFAULT_STRATEGY, SESSION_OPTIONS, DecodeConfig,
                                     check_decoder_settings, with_deprecated)
from edgespec.runtime.chat import as_messages, compile_template, render_chat
from edgespec.runtime.context import drafter_context
from edgespec.runtime.device_profile import graph_paths, plan_for
from edgespec.runtime.device_plan import DevicePlanning
from edgespec.runtime.governor import Governor
from edgespec.runtime.grammar import start_constraint
from edgespec.runtime.kv import DeferredRunner, ModelRunner
from edgespec.runtime.plan import MAX_GAMMA
from edgespec.runtime.randomised import draft_randomised
from edgespec.runtime.shared import Setup, Shared
from edgespec.runtime.generation import Generation
from edgespec.runtime.sampling import make_rng
from edgespec.runtime.sessions import CPU, create_session, create_sessions, is_cpu_only, prefill_graph_request
from edgespec.runtime.stats import GenerationStats
from edgespec.runtime.strategies import choose_auto, get_strategy
from edgespec.runtime.text import TextState
from edgespec.runtime.verdicts import remembered

@dataclass
class GenerationResult:
    text: str
    token_ids: list[int]
    stats: GenerationStats
    prompt_token_ids: list[int] = field(default_factory=list)

    @property
    def finish_reason(self) -> str:
        """OpenAI's word: "stop" (EOS or a stop string: under a grammar, the output is complete) or
        "length" (max_new_tokens, or an interrupted stream)."""
        return "stop" if self.stats.stop_reason in ("eos", "stop") else "length"


class SpeculativeDecoder:
    """Speculative decoding over an edgespec bundle. See docs/architecture.md for the API."""

    def __init__(self, bundle: Bundle | str | Path, strategy: str = DEFAULT_STRATEGY,
                 draft_length: int | str = DEFAULT_DRAFT_LENGTH, ep="cpu", *, threads: int | None = None, draft_probability: float | str | None = None,
                 prefill_graph: bool | str = "auto", allow_fallback: bool = False, options: dict | None = None,
                 **deprecated):
        # every setting is checked here, first: loading and sessions take seconds. `options`: the tuning
        # knobs and strategy options (config.split_options); `deprecated`: their keyword form of earlier releases
        config, session = check_decoder_settings(strategy, draft_length, threads, draft_probability,
                                                 options=with_deprecated(options, deprecated))
        draft_ep, draft_threads, defer_drafter, store_mb = (session[k] for k in SESSION_OPTIONS)
        if not isinstance(bundle, Bundle):
            bundle = Bundle.load(bundle)
        self.bundle = bundle
        strat = config.strategy
        if not bundle.has_drafter and strat.name == "auto":
            config = replace(config, strategy=get_strategy("ngram"))   # the one speculation a target-only bundle can do
        elif not bundle.has_drafter and strat.uses_drafter:
            raise GenerationError(f"bundle {bundle.path} has no drafter: strategy {strat.name!r} needs one; use "
                                  "strategy 'ngram' (prompt lookup) or 'ar', or export a pair")
        uses_drafter = config.strategy.uses_drafter
        if uses_drafter and config.strategy.check:      # refuse before paying for the sessions
            config.strategy.check(bundle, dict(config.options))
        # this machine's plan (runtime/plan.py): which graph runs the target, whether the drafter pays
        self.planning = DevicePlanning(bundle, threads, ep, *plan_for(bundle, threads, ep),
                                       measure=strategy == "auto")
        step_graph = self.planning.plan.step_graph
        if step_graph == "prefill":
            prefill_graph = False          # the graph itself
        # alone (no drafter session), the target's threads keep spinning between steps (sessions.py); so
        # do an `auto` decoder's where this machine's plan starts without the drafter
        beside = uses_drafter and (config.strategy.name != "auto" or self.planning.plan.drafter)
        # threads=None: the counts this machine's thread scaling chose (device_profile), else every core
        target_threads = threads if threads is not None else self.planning.plan.threads
        if draft_threads is None:
            draft_threads = threads if threads is not None else self.planning.plan.draft_threads
        requests = [dict(model_path=graph_paths(bundle)[step_graph], ep=ep, threads=target_threads,
                         allow_fallback=allow_fallback, role="target", stop_spinning=beside)]
        prefill_request, prefill_now, prefill_from = prefill_graph_request(bundle, prefill_graph, ep, requests[0],
                                                                           defer_drafter)
        if prefill_now:
            requests.append(prefill_request)
        drafter_request = None
        if uses_drafter:
            drafter_request = dict(model_path=bundle.drafter.onnx, ep=ep if draft_ep is None else draft_ep,
                                   threads=draft_threads,
                                   allow_fallback=allow_fallback, role="drafter")
        # The drafter's session waits for its first forward (kv.DeferredRunner) on the CPU EP; other EPs
        # build it now, so that an EP that fails to load says so here. Built now, a pair's two sessions
        # are built at the same time (create_sessions), and the text side is made ready meanwhile.
        defer = bool(drafter_request) and defer_drafter and is_cpu_only(drafter_request["ep"])
        sessions = create_sessions(requests + ([drafter_request] if drafter_request and not defer else []),
                                   beside=lambda: _prepare_text(bundle))
        tinfo = bundle.target.info
        sess, target_session_info = sessions.pop(0)
        prefill = sessions.pop(0)[0] if prefill_now else None
        later = (lambda: create_session(**prefill_request)[0]) if prefill_request and not prefill_now else None
        target = ModelRunner(sess, "target", bundle.target.max_position, prefill_session=prefill,
                                  prefill_factory=later, prefill_from=prefill_from,
                                  remember_chunks=None if prefill_request is None else partial(
                                      remembered, bundle.target.prefill_onnx, "prefill_chunks_exact", threads))
        # the plan's step width; on another EP the runner's own probe may have padded (runtime/probes.py)
        target.min_tokens = self.planning.plan.step_tokens if is_cpu_only(ep) else \
            max(target.min_tokens, self.planning.plan.step_tokens)
        self._check_runner(target, tinfo, bundle.target.vocab_size, "target")
        if prefill is not None:
            target.check_prefill_chunks()
        drafter = text_context = None
        if uses_drafter:
            if defer:
                drafter = DeferredRunner(lambda: self._drafter_runner(create_session(**drafter_request)),
                                         bundle.drafter.max_position, [CPU])
            else:
                drafter = self._drafter_runner(sessions[0])
            text_context = drafter_context(bundle)          # token tables: built once per decoder
        self._shared = Shared(bundle, target, drafter, text_context, target_session_info, store_mb)
        self._configure(config)

    def _configure(self, config: DecodeConfig) -> None:
        """Take a checked config on this decoder's sessions: the variant's Setup (the strategy's
        precomputed tables, the governors and the per-round arrays)."""
        strat = config.strategy
        if strat.uses_drafter and not self.bundle.has_drafter:
            raise GenerationError(f"bundle {self.bundle.path} has no drafter: strategy {strat.name!r} needs one; "
                                  "use strategy 'ngram' (prompt lookup) or 'ar'")
        if strat.uses_drafter and self._shared.drafter is None:
            raise GenerationError(f"strategy {strat.name!r} needs a drafter session; this decoder was created "
                                  "with 'ar' and has none")
        self.config = config = config.resolved(self.bundle, self.bundle.drafter.max_position
                                               if self._shared.drafter else None)
        if strat.check:
            strat.check(self.bundle, dict(config.options))
        self.setup = Setup(config, strat.prepare(self.bundle, dict(config.options)), self.bundle.target.vocab_size)
        self._auto: dict = {}                  # strategy="auto": the decoder chosen per sampling mode
        self.last_result: GenerationResult | None = None
        self._last_generation: Generation | None = None

    @property
    def strategy(self):
        return self.config.strategy

    # what one variant has of its own (shared.Setup) and what all share (shared.Shared)
    governor = property(lambda self: self.setup.governor)
    source_governors = property(lambda self: self.setup.source_governors)
    prepared = property(lambda self: self.setup.prepared)
    target = property(lambda self: self._shared.target)
    target_session_info = property(lambda self: self._shared.target_session_info)
    drafter = property(lambda self: self._shared.drafter if self.strategy.uses_drafter else None)

    def governor_for(self, source: str | None) -> Governor | None:
        """The draft-length governor of a round from `source` (None: the strategy's only proposer)."""
        return self.setup.governor_for(source)

    def variant(self, strategy: str | None = None, draft_length: int | str | None = None,
                draft_probability: float | str | None = None, **changes) -> "SpeculativeDecoder":
        """Another strategy / draft length / decoder setting on the SAME sessions, KV runners and token
        tables: `dataclasses.replace` of this decoder's config (`changes`: any other DecodeConfig field;
        any other keyword is a strategy option, and strategy options replace this decoder's).
        draft_probability is not inherited; draft_length is, for a speculative strategy. Generations of
        a decoder and its variants must not interleave: a newer call supersedes an unfinished stream of
        any of them."""
        fields = {f.name for f in dataclasses.fields(DecodeConfig)} - {"strategy", "options"}
        options = {k: changes.pop(k) for k in list(changes) if k not in fields}
        strat = get_strategy(strategy) if strategy is not None else self.strategy
        if strat.name == "auto" and not self.bundle.has_drafter:
            strat = get_strategy("ngram")
        if draft_length is None:
            draft_length = self.config.draft_length if strat.speculative else 1
        config = replace(self.config, strategy=strat, draft_length=draft_length, draft_probability=draft_probability,
                         options=options, **changes)
        new = object.__new__(SpeculativeDecoder)      # the same bundle, plan and Shared; its own Setup
        new.bundle, new.planning, new._shared = self.bundle, self.planning, self._shared
        new._configure(config)
        return new

    # ------------------------------------------------------------------ resources
    @property
    def prefix_cache(self) -> PrefixCache:
        return self._shared.prefix

    @property
    def generation_id(self) -> int:
        """Number of the newest generation of this decoder and its variants."""
        return self._shared.generation

    def close(self) -> None:
        """Stop the worker thread, if one was started (a later generation starts a new one)."""
        self._shared.close()

    def __enter__(self) -> "SpeculativeDecoder":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------ checks
    def _resolved(self, greedy: bool) -> "SpeculativeDecoder":
        """This decoder, or for strategy="auto" the variant it stands for in this sampling mode."""
        if self.strategy.name != "auto":
            return self
        plan = self.planning.current()
        fast = plan.plain_steps == "fast"
        name = choose_auto(self.bundle, greedy, randomised=self.config.draft_probability is not None,
                           drafter=plan.drafter, exact=plan.gamma_max > 0, fast_plain=fast)
        key = (name, fast and name == "ar")
        if key not in self._auto:
            steps = {"plain_steps": "fast"} if key[1] else {}
            self._auto[key] = self.variant(name, draft_probability=self.config.draft_probability,
                                           **steps, **self.config.options)
        dec = self._auto[key]
        drafting = dec.setup.drafter_governor()
        if drafting is not None:   # drafter rounds keep to the plan's gamma range, which plan.py rates up to
            # MAX_GAMMA drafts: a max_draft_length above that is the caller's and is honoured, not capped
            drafting.cap = max(plan.gamma_max, 1) if drafting.gamma_max <= MAX_GAMMA else drafting.gamma_max
        return dec

    def _check_runner(self, runner: ModelRunner, info: dict, width: int, role: str) -> None:
        if isinstance(runner.vocab, int) and runner.vocab != width:
            raise BundleError(f"bundle {self.bundle.path}: {role} graph emits {runner.vocab} logits, manifest expects {width}")
        layers = info.get("num_layers")
        if layers and len(runner.past_names) != 2 * int(layers):
            raise BundleError(f"bundle {self.bundle.path}: {role} graph has {len(runner.past_names)} past inputs, "
                              f"manifest says {layers} layers")

    def _drafter_runner(self, made: tuple) -> ModelRunner:
        """The drafter's runner over a created (session, SessionInfo), checked against the bundle."""
        sess, info = made
        runner = ModelRunner(sess, "drafter", self.bundle.drafter.max_position, exact=False)
        runner.session_info = info
        self._check_runner(runner, self.bundle.drafter.info, self.bundle.kept, "drafter")
        names = [n for n in ("index_map", "draft_ids") if n in runner.extra_outputs]
        for name, arr in zip(names, runner.run_extra(names) if names else ()):
            if not np.array_equal(np.asarray(arr).reshape(-1), getattr(self.bundle, name)):
                raise BundleError(f"bundle {self.bundle.path}: the drafter graph's {name} differs from vocab/{name}.npy "
                                  "(mismatched bundle)")
        return runner

    @property
    def drafter_session_info(self):
        """The drafter session's SessionInfo (None: no drafter, or one not built yet)."""
        return self._shared.drafter_session_info() if self.drafter is not None else None

    @property
    def providers(self) -> dict:
        return self._shared.providers(with_drafter=self.drafter is not None)

    # ------------------------------------------------------------------ prompts
    def encode_prompt(self, prompt, chat: bool = False) -> list[int]:
        """Target token ids for a str prompt (or chat messages), or a validated list of ids."""
        tok = self.bundle.target.tokenizer
        if chat:
            b = self.bundle.target
            bos = tok.id_to_token(b.bos_id) if b.bos_id is not None else ""
            eos = tok.id_to_token(b.eos_ids[0]) if b.eos_ids else ""
            text = render_chat(self.bundle.require_chat_template(), as_messages(prompt), bos_token=bos or "", eos_token=eos or "")
            ids = tok.encode(text, add_special_tokens=False).ids
        elif isinstance(prompt, str):
            if not prompt:
                raise GenerationError("empty prompt")
            ids = tok.encode(prompt, add_special_tokens=True).ids
        elif isinstance(prompt, (list, tuple, np.ndarray)):
            if not all(isinstance(i, (int, np.integer)) and not isinstance(i, bool) for i in prompt):
                raise GenerationError("prompt token ids must be integers (a flat list of ints)")
            ids = [int(i) for i in prompt]
            bad = [i for i in ids if not 0 <= i < self.bundle.target.vocab_size]
            if bad:
                raise GenerationError(f"prompt token ids out of range [0, {self.bundle.target.vocab_size}): {bad[:5]}")
        else:
            raise GenerationError(f"prompt must be a str or a list of token ids, got {type(prompt).__name__}")
        if not ids:
            raise GenerationError("empty prompt")
        return ids

    # ------------------------------------------------------------------ public API
    def generate(self, prompt, max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS, temperature: float = 0.0,
                 top_k: int | None = None, top_p: float | None = None, seed: int | None = None,
                 stop: str | Sequence[str] | None = None, chat: bool = False, **constraint) -> GenerationResult:
        """`constraint`: structured output (docs/structured-output.md); `draft_scope`: docs/runtime.md."""
        with self._shared.lock:      # calls on one decoder (and its variants) run one at a time
            for _ in self._run(prompt, max_new_tokens, temperature, top_k, top_p, seed, stop, chat, incremental=False,
                               **constraint):
                pass
            return self.last_result

    def stream(self, prompt, max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS, temperature: float = 0.0,
               top_k: int | None = None, top_p: float | None = None, seed: int | None = None,
               stop: str | Sequence[str] | None = None, chat: bool = False, **constraint) -> Iterator[str]:
        """Text deltas (each a valid str; their concatenation is the result's text). The full result,
        stats included, is in `self.last_result` once the generator ends or is closed. Arguments are
        checked when this is called, not at the first `next()`."""
        run = self._run(prompt, max_new_tokens, temperature, top_k, top_p, seed, stop, chat, **constraint)
        with self._shared.lock:
            next(run)  # runs the argument checks now; the first yield carries no text
        return self._locked(run)

    def _locked(self, run) -> Iterator[str]:
        """Each step of a stream holds the decoder's lock: another thread's call waits for the step,
        and a call that starts between two steps supersedes the stream (its next step says so)."""
        try:
            while True:
                with self._shared.lock:
                    try:
                        delta = next(run)
                    except StopIteration:
                        return
                yield delta
        finally:
            with self._shared.lock:
                run.close()

    def grammar_state(self, **constraint):
        """A fresh matcher for one generation's constraint, or None (grammar.start_constraint)."""
        return start_constraint(self.bundle, self._shared, **constraint)

    # ------------------------------------------------------------------ the loop
    def _run(self, prompt, max_new_tokens, temperature, top_k, top_p, seed, stop, chat, incremental=True,
             jump_forward: bool = True, draft_scope: str | None = None, **constraint):
        """The generator behind generate() and stream(). With incremental=False (generate without stop
        strings) the text is decoded once at the end instead of after every round."""
        t_start = time.perf_counter()
        params, stops = check_generation_args(max_new_tokens, temperature, top_k, top_p, seed, stop)
        grammar = self.grammar_state(**constraint)       # a bad constraint fails here, before any model runs
        prompt_ids = self.encode_prompt(prompt, chat)
        limit = self.target.max_position
        if limit and len(prompt_ids) + max_new_tokens > limit:
            raise GenerationError(f"prompt ({len(prompt_ids)} tokens) + max_new_tokens ({max_new_tokens}) exceeds the "
                                  f"target's context length {limit}")
        dec = self._resolved(params.greedy)
        # randomised drafting's no-draft rows are not masked by a grammar: constrained, it drafts as TLI
        randomised = dec.config.draft_probability is not None and not params.greedy and grammar is None
        gen = Generation(self._shared, dec.setup, prompt_ids, params, make_rng(seed), int(max_new_tokens), t_start,
                         propose=draft_randomised if randomised else None, grammar=grammar,
                         jump_forward=bool(jump_forward), scope=draft_scope)
        self._last_generation = gen          # for debugging and the profiler
        text_state = TextState(self.bundle.target.tokenizer, stops)
        reason, finished, kv_ids = "interrupted", False, None
        yield ""
        try:
            new = gen.prefill()
            while True:
                reason = gen.append(new)
                if incremental or stops or reason is not None:
                    reason = text_state.update(gen.generated, reason) or reason
                if text_state.stopped_at is not None:
                    kv_ids = prompt_ids + gen.generated            # the KV holds tokens past the stop
                    del gen.generated[text_state.stopped_at:]
                delta = text_state.take(final=reason is not None)
                if delta:
                    yield delta
                if reason is not None:
                    break
                new = gen.round()
            finished = True
        except GenerationError:             # mid-generation (one line): the output so far stays, in last_result
            reason = text_state.update(gen.generated, "error")
            raise
        finally:
            gen.finish(reason, finished, kv_ids)
            self.planning.after_generation(dec, gen.stats, prompt_ids, gen.generated)
            if gen.id == self._shared.generation:   # a superseded stream must not overwrite a newer result
                self.last_result = GenerationResult(
                    text=text_state.emitted if reason is None else text_state.final_text,
                    token_ids=list(gen.generated), stats=gen.stats, prompt_token_ids=prompt_ids)


def _prepare_text(bundle: Bundle) -> None:
    """Parse the tokenizers a load left for first use, and compile the chat template (a template that
    does not compile fails at the first chat call, as before: plain prompts still work)."""
    for side in (bundle.target, bundle.drafter):
        if side is not None:
            side.tokenizer
    if bundle.target.chat_template:
        with contextlib.suppress(GenerationError):
            compile_template(bundle.target.chat_template)
