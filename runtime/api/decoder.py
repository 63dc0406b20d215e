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

import copy
import dataclasses
import secrets
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np

from edgespec.errors import GenerationError, first_line
from edgespec.runtime.api.build import build_shared
from edgespec.runtime.bundle.bundle import Bundle
from edgespec.runtime.api.checks import DEFAULT_MAX_NEW_TOKENS, check_generation_args
from edgespec.runtime.api.config import (DEFAULT_DRAFT_LENGTH, DEFAULT_STRATEGY, DecodeConfig, check_decoder_settings,
                                     checked_config, with_deprecated)
from edgespec.runtime.bundle.chat import as_messages
from edgespec.runtime.bundle.chat_tokens import encode_chat
from edgespec.runtime.planning.device_profile import plan_for
from edgespec.runtime.engine.sessions import run_errors
from edgespec.runtime.planning.device_plan import DevicePlanning
from edgespec.runtime.samplers.grammar import start_constraint
from edgespec.runtime.round.randomised import draft_randomised
from edgespec.runtime.planning.records import step_plan
from edgespec.runtime.api.shared import Setup
from edgespec.runtime.api.generation import Generation
from edgespec.runtime.samplers.coupled import RaceNoise
from edgespec.runtime.samplers.logprobs import TokenLogprob, check_top
from edgespec.runtime.samplers.sampling import make_rng
from edgespec.runtime.api.stats import GenerationStats
from edgespec.runtime.round.strategies import choose_auto, for_bundle, get_strategy
from edgespec.runtime.bundle.text import TextState, require_text

@dataclass
class GenerationResult:
    text: str
    token_ids: list[int]
    stats: GenerationStats
    prompt_token_ids: list[int] = field(default_factory=list)
    # the target's log-probability of each token id (aligned with token_ids), where asked: generate(logprobs=k)
    logprobs: list[TokenLogprob] | None = None

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
        if not isinstance(bundle, Bundle):
            bundle = Bundle.load(bundle)
        self.bundle = bundle
        config = replace(config, strategy=for_bundle(config.strategy, bundle))
        config = checked_config(bundle, config)         # refuse before paying for the sessions
        # this machine's plan (runtime/planning/plan.py): which graph runs the target, whether the drafter pays
        self.planning = DevicePlanning(bundle, threads, ep, *plan_for(bundle, threads, ep),
                                       measure=strategy == "auto")
        plan, strat = self.planning.plan, config.strategy
        # alone (no drafter session), the target's threads keep spinning between steps (sessions.py); so
        # do an `auto` decoder's where this machine's plan starts without the drafter
        alone = not strat.uses_drafter or strat.name == "auto" and not plan.drafter
        self.shared = build_shared(bundle, plan, ep, threads, session, with_drafter=strat.uses_drafter,
                                   target_alone=alone, prefill_graph=prefill_graph, allow_fallback=allow_fallback)
        self.config, self.setup = config, Setup.for_config(bundle, self.shared, config)
        self.auto_variants: dict = {}          # strategy="auto": the variant it stands for, per sampling mode
        self.last_result: GenerationResult | None = None
        self.last_generation: Generation | None = None

    @property
    def strategy(self):
        return self.config.strategy

    # the runners, for profiling: what all variants share (shared.Shared); a variant's own is its `setup`
    target = property(lambda self: self.shared.target)
    drafter = property(lambda self: self.shared.drafter if self.strategy.uses_drafter else None)

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
        strat = for_bundle(get_strategy(strategy) if strategy is not None else self.strategy, self.bundle)
        if draft_length is None:
            draft_length = self.config.draft_length if strat.speculative else 1
        config = replace(self.config, strategy=strat, draft_length=draft_length, draft_probability=draft_probability,
                         options=options, **changes)
        config = checked_config(self.bundle, config)
        new = copy.copy(self)                  # the same bundle, planning and Shared; its own config and Setup
        new.config, new.setup = config, Setup.for_config(self.bundle, self.shared, config)
        new.auto_variants, new.last_result, new.last_generation = {}, None, None
        return new

    # ------------------------------------------------------------------ resources
    def close(self) -> None:
        """Stop the worker thread, if one was started (a later generation starts a new one)."""
        self.shared.close()

    def __enter__(self) -> "SpeculativeDecoder":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------ checks
    def _resolved(self, plan, greedy: bool, exact_plain: bool = False) -> "SpeculativeDecoder":
        """This decoder, or for strategy="auto" the variant it stands for under `plan` in this sampling mode.
        `exact_plain`: plain steps stay exact even where the plan would run 1-token steps (a seeded
        generation's tokens must not depend on whether it speculated)."""
        if self.strategy.name != "auto":
            return self
        fast = plan.plain_steps == "fast" and not exact_plain
        name = choose_auto(self.bundle, greedy, randomised=self.config.draft_probability is not None,
                           drafter=plan.drafter, exact=plan.gamma_max > 0, fast_plain=fast)
        key = (name, fast and name == "ar")
        if key not in self.auto_variants:
            steps = {"plain_steps": "fast"} if key[1] else {}
            self.auto_variants[key] = self.variant(name, draft_probability=self.config.draft_probability,
                                           **steps, **self.config.options)
        return self.auto_variants[key]

    @property
    def drafter_session_info(self):
        """The drafter session's SessionInfo (None: no drafter, or one not built yet)."""
        return self.shared.drafter_session_info() if self.drafter is not None else None

    @property
    def providers(self) -> dict:
        return self.shared.providers(with_drafter=self.drafter is not None)

    # ------------------------------------------------------------------ prompts
    def encode_prompt(self, prompt, chat: bool = False, tools: list[dict] | None = None,
                      parse_special: bool = False) -> list[int]:
        """Target token ids for a str prompt (or chat messages, `tools` given to the template), or a
        validated list of ids. Special-token text inside a message's content stays plain text unless
        `parse_special` (runtime/bundle/chat_tokens.py); a str prompt without chat is read as written."""
        tok = self.bundle.target.tokenizer
        if chat:
            b = self.bundle.target
            bos = tok.id_to_token(b.bos_id) if b.bos_id is not None else ""
            eos = tok.id_to_token(b.eos_ids[0]) if b.eos_ids else ""
            messages = as_messages(prompt)
            for m in messages:
                require_text(m["content"], f"a {m['role']} message")
            ids = encode_chat(tok, self.bundle.require_chat_template(), messages, bos_token=bos or "",
                              eos_token=eos or "", tools=tools, parse_special=parse_special)
        elif isinstance(prompt, str):
            if not prompt:
                raise GenerationError("empty prompt")
            ids = tok.encode(require_text(prompt, "prompt"), add_special_tokens=True).ids
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
                 stop: str | Sequence[str] | None = None, chat: bool = False, min_p: float | None = None,
                 logprobs: int | None = None, **constraint) -> GenerationResult:
        """`constraint`: structured output (docs/structured-output.md); `draft_scope`: docs/runtime.md.
        `logprobs`: None (off), or k = 0..20: the result's `logprobs` holds each token's TokenLogprob (the
        target's own log-probability and its k most likely alternatives: runtime/samplers/logprobs.py)."""
        with self.shared.lock:      # calls on one decoder (and its variants) run one at a time
            for _ in self._run(prompt, max_new_tokens, temperature, top_k, top_p, seed, stop, chat, min_p,
                               incremental=False, logprobs=logprobs, **constraint):
                pass
            return self.last_result

    def stream(self, prompt, max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS, temperature: float = 0.0,
               top_k: int | None = None, top_p: float | None = None, seed: int | None = None,
               stop: str | Sequence[str] | None = None, chat: bool = False, min_p: float | None = None,
               logprobs: int | None = None, **constraint) -> Iterator[str]:
        """Text deltas (each a valid str; their concatenation is the result's text). The full result,
        stats included, is in `self.last_result` once the generator ends or is closed. Arguments are
        checked when this is called, not at the first `next()`. With `logprobs` (as generate's), after
        each delta `self.last_generation.logprobs` lists the TokenLogprob of every token committed so far,
        aligned with `self.last_generation.generated` (a stop string's cut applied): a caller sends the
        entries past those it sent already (the delta's text may end before the last token's)."""
        run = self._run(prompt, max_new_tokens, temperature, top_k, top_p, seed, stop, chat, min_p,
                        logprobs=logprobs, **constraint)
        with self.shared.lock:
            next(run)  # runs the argument checks now; the first yield carries no text
        return self._locked(run)

    def _locked(self, run) -> Iterator[str]:
        """Each step of a stream holds the decoder's lock: another thread's call waits for the step,
        and a call that starts between two steps supersedes the stream (its next step says so)."""
        try:
            while True:
                with self.shared.lock:
                    try:
                        delta = next(run)
                    except StopIteration:
                        return
                yield delta
        finally:
            with self.shared.lock:
                run.close()

    def grammar_state(self, **constraint):
        """A fresh matcher for one generation's constraint, or None (grammar.start_constraint)."""
        return start_constraint(self.bundle, self.shared, **constraint)

    # ------------------------------------------------------------------ the loop
    def _run(self, prompt, max_new_tokens, temperature, top_k, top_p, seed, stop, chat, min_p=None, incremental=True,
             jump_forward: bool = True, draft_scope: str | None = None, logprobs: int | None = None, **constraint):
        """The generator behind generate() and stream(). With incremental=False (generate without stop
        strings) the text is decoded once at the end instead of after every round. `logprobs` (None, or
        the alternatives per token, 0..20): the target's log-probability of each token, in the result's
        `logprobs`; while streaming, `last_generation.logprobs` holds those of the tokens so far."""
        t_start = time.perf_counter()
        params, stops = check_generation_args(max_new_tokens, temperature, top_k, top_p, seed, stop, min_p)
        logprobs = check_top(logprobs)
        grammar = self.grammar_state(**constraint)       # a bad constraint fails here, before any model runs
        prompt_ids = self.encode_prompt(prompt, chat)
        limit = self.target.max_position
        if limit and len(prompt_ids) + max_new_tokens > limit:
            raise GenerationError(f"prompt ({len(prompt_ids)} tokens) + max_new_tokens ({max_new_tokens}) exceeds the "
                                  f"target's context length {limit}")
        plan = self.planning.current()
        coupled = self.config.couples(seed, params.greedy)
        dec = self._resolved(plan, params.greedy, exact_plain=coupled or logprobs is not None)   # ar's rows
        step = step_plan(plan, dec.config, self.target.min_tokens, auto=self.strategy.name == "auto",
                         verify_ms=self.planning.verify_costs())
        # randomised drafting's no-draft rows are not masked by a grammar: constrained, it drafts as TLI
        # coupled, a draft is kept exactly when it is the target's own pick: randomised drafting's coins change
        # nothing there, so it drafts as TLI
        randomised = dec.config.draft_probability is not None and not params.greedy and grammar is None and not coupled
        if coupled and seed is None:
            seed = secrets.randbits(63)
        gen = Generation(self.shared, dec.setup, step, prompt_ids, params, make_rng(seed), int(max_new_tokens), t_start,
                         propose=draft_randomised if randomised else None, grammar=grammar,
                         jump_forward=bool(jump_forward), scope=draft_scope, noise=RaceNoise(seed) if coupled else None,
                         logprobs=logprobs)
        self.last_generation = gen           # its state, open to inspection (drafter context, grammar)
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
                    gen.trim_logprobs()
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
        except run_errors() as exc:         # a failed ORT run: the same, in one line
            reason = text_state.update(gen.generated, "error")
            raise GenerationError(f"ONNX Runtime failed at position {len(prompt_ids) + len(gen.generated)}: "
                                  f"{first_line(exc)}") from None
        finally:
            gen.finish(reason, finished, kv_ids)
            self.planning.after_generation(gen.record(), self.shared)
            if gen.id == self.shared.generation:   # a superseded stream must not overwrite a newer result
                self.last_result = GenerationResult(
                    text=text_state.emitted if reason is None else text_state.final_text,
                    token_ids=list(gen.generated), stats=gen.stats, prompt_token_ids=prompt_ids,
                    logprobs=None if gen.logprobs is None else list(gen.logprobs))
