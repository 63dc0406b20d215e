"""The state of one generate/stream call (`Generation`) and its phases: `prefill`, then `round` after
round (rounds.speculative_round) until `append` says stop, then `finish`.

State between rounds: the target's KV covers prompt + generated[:-1]; `last` (= generated[-1]) is fed
first in the next verify forward. The drafter's side (context.DrafterContext) holds the committed text in
drafter tokens and the part of it its KV covers.
"""
from __future__ import annotations

import functools
import time
from typing import Callable

import numpy as np

from edgespec.errors import GenerationError
from edgespec.runtime.samplers.answer_store import check_scope
from edgespec.runtime.samplers.coupled import RaceNoise, race_pick
from edgespec.runtime.round.context import DrafterContext, DrafterWindow
from edgespec.runtime.samplers.logprobs import token_logprobs
from edgespec.runtime.samplers.grammar import GrammarState, mask_distribution, mask_logits, masked_greedy
from edgespec.runtime.samplers.lookup import DEFAULT_MAX_N, json_string_view
from edgespec.runtime.planning.records import GenerationRecord, StepPlan
from edgespec.runtime.round.rounds import MAX_FORCED, forced_round, speculative_round
from edgespec.runtime.samplers.sampling import SamplingParams, probabilities, sample
from edgespec.runtime.samplers.verify import greedy_id
from edgespec.runtime.api.stats import GenerationStats


class Generation:
    """Mutable state of one generate/stream call: committed ids, sampling, stats, and the strategy's
    per-generation state (`Strategy.start`). What outlives it comes in `shared` (runners, prefix cache,
    token tables: shared.Shared) and `setup` (the variant's config, tables, governors, arrays: shared.Setup),
    and how its steps run in `step` (records.StepPlan); it reads nothing else of the decoder."""

    def __init__(self, shared, setup, step: StepPlan, prompt_ids: list[int], params: SamplingParams,
                 rng: np.random.Generator, max_new_tokens: int, started: float | None = None,
                 propose: Callable | None = None, grammar: GrammarState | None = None, jump_forward: bool = True,
                 scope: str | None = None, noise: RaceNoise | None = None, logprobs: int | None = None):
        self.draft_scope = check_scope(scope)   # the answer store's partition this call reads and records into
        shared.generation += 1
        self.shared, self.setup = shared, setup
        self.id = shared.generation          # a newer generation on the same runners supersedes this one
        self.config = cfg = setup.config
        self.strategy = cfg.strategy
        self.propose = propose or cfg.strategy.propose      # randomised drafting passes its own
        self.prepared = setup.prepared       # what strategy.prepare computed once per variant
        self.prompt_ids = prompt_ids
        self.params = params
        self.rng = rng
        self.noise = noise                   # coupled sampling (coupled.py): a seeded sampled generation's noise
        self.max_new_tokens = max_new_tokens
        self.started = time.perf_counter() if started is None else started     # the call's start (TTFT, total)
        self.target = shared.target
        self.drafter = shared.drafter if setup.uses_drafter else None
        self.q_rows, self.p_rows, self.work = setup.scratch     # per-round arrays, reused by every round
        self.drafter_ctx = None
        if self.drafter is not None and shared.text_context is not None:
            d = shared.bundle.drafter
            window = DrafterWindow(cfg.drafter_window, d.bos_id if d.add_bos else None)
            self.drafter_ctx = DrafterContext(shared.text_context, self.drafter, window)
        # how the target's steps run (records.StepPlan): plain steps of a speculative strategy may carry a
        # lookup guess (plain_step), with a governor when it pays, without one where the step pads anyway
        self.step = step
        self.drafter_reached = self.drafter_accepted = 0     # the drafter's rounds' positions (record())
        self.lookup_max_n = int(cfg.options.get("ngram_max_n", DEFAULT_MAX_N))
        self.generated: list[int] = []
        # asked for: the target's TokenLogprob of each committed token, aligned with `generated`
        # (runtime/samplers/logprobs.py); a streaming caller reads it after each delta
        self.logprobs: list | None = [] if logprobs is not None else None
        self.top_logprobs = logprobs or 0
        self.last = -1
        self.stats = GenerationStats(strategy=cfg.strategy.name, draft_length=cfg.gamma,
                                     draft_length_setting=cfg.draft_length if cfg.gamma else 0,
                                     prompt_tokens=len(prompt_ids),
                                     providers=shared.providers(with_drafter=self.drafter is not None))
        self.stats.fallbacks = [i.fallback for i in (shared.target_session_info, shared.drafter_session_info())
                                if i is not None and i.fallback]
        self.strategy_state = cfg.strategy.start(self) if cfg.strategy.start else None
        self.grammar = grammar               # constrained decoding (grammar.py), or None
        self.jump_forward = jump_forward and grammar is not None
        self.forced: list[int] = []          # this round's forced tokens, before the drafter's drafts
        # a token-level drafter drafts on after the forced tokens in the same round; others get rounds of
        # forced tokens alone (forced_round)
        self.drafts_on_forced = self.drafter_ctx is not None and cfg.strategy.distribution is not None
        if self.jump_forward and not params.greedy:                   # room for forced + drafted rows
            rows, v = MAX_FORCED + cfg.gamma + 1, self.q_rows.shape[1]
            self.q_rows, self.p_rows = np.zeros((rows, v)), np.zeros((rows, v))

    @functools.cached_property
    def lookup_view(self) -> np.ndarray | None:
        """JSON output quotes the prompt's text escaped: under a grammar, lookup searches the prompt as a
        JSON string too (lookup.json_string_view), made at the first lookup (`ar` makes none)."""
        if self.grammar is None:
            return None
        return json_string_view(self.shared.bundle.target.tokenizer, self.prompt_ids)

    def check_current(self) -> None:
        if self.id != self.shared.generation:
            raise GenerationError("this stream was superseded by a newer generate/stream call on the same decoder")

    def finish(self, reason: str | None, completed: bool, kv_ids: list[int] | None = None) -> None:
        """Book the generation's totals in its stats and, where it completed and is still the newest,
        remember what the runners' KV holds for the next call's prefix reuse (prefill() forgot it)."""
        st = self.stats
        st.total_ms = (time.perf_counter() - self.started) * 1e3
        st.new_tokens = len(self.generated)
        st.prefill_tokens = min(1, st.new_tokens)
        st.stop_reason = reason or "interrupted"
        if self.setup.governor is not None and st.gamma_per_step:
            st.draft_length = float(np.mean(st.gamma_per_step))
        if self.grammar is not None:
            st.grammar_ms, st.grammar_masks = self.grammar.mask_ms, self.grammar.mask_count
        dc = self.drafter_ctx
        st.drafter_resyncs = dc.text.resyncs if dc is not None else 0
        st.draft_refills = dc.window.refills if dc is not None else 0
        if completed and self.config.prefix_reuse and self.id == self.shared.generation:
            kv_ids = (kv_ids or self.prompt_ids + self.generated)[:self.target.length]
            if self.step.unpadded:
                # unpadded steps wrote the answer's positions, not what a cold prefill computes: the KV is
                # cropped to the prompt's, which the (wide) prefill computed, so the next call reuses that
                kv_ids = kv_ids[:len(self.prompt_ids)]
            if len(kv_ids) < self.target.length:
                # and positions past the ids it knows go too: a round whose draft ran past EOS kept them
                self.target.crop(len(kv_ids))
            self.shared.prefix.remember(kv_ids, dc.ids if dc else None, dc.window if dc else None)
        if completed:                 # only a completed answer drafts for later calls (answer_store.py)
            self.shared.answers.record(self.prompt_ids, self.generated, self.draft_scope)

    def record(self) -> GenerationRecord:
        """What this generation hands the planning (device_plan.DevicePlanning.after_generation)."""
        return GenerationRecord(self.stats, self.prompt_ids, list(self.generated), self.step,
                                self.drafter_reached, self.drafter_accepted)

    # -- phases
    def prefill(self) -> list[int]:
        """The target runs the prompt (after the prefix its KV kept from the previous call: prefix.py)
        and picks the first token; the drafter's context is set up, and its window filled at its first
        forward (context.DrafterWindow), not here: TTFT waits for the target only."""
        self.check_current()
        cache, reuse, dc = self.shared.prefix, self.config.prefix_reuse, self.drafter_ctx
        if self.target.prefill_pending and self.target.prefill_graph_for(len(self.prompt_ids)):
            # a deferred prefill graph, built for its first long prompt (its check empties the cache, which
            # had nothing of that prompt it could reuse: positions the prefill graph never computed)
            self.stats.prefill_graph_load_ms += self.target.build_prefill_graph()
        kept = cache.target_reuse(self.prompt_ids, self.target) if reuse else self.target.reset() or 0
        if dc is not None:
            dc.text.start(self.prompt_ids)
            if reuse:
                cache.drafter_reuse(dc.ids, self.drafter, dc.window)
            else:
                self.drafter.reset()
        cache.forget()                # until this generation ends normally (finish)
        self.stats.reused_tokens = kept
        self.target.reserve(len(self.prompt_ids) + self.max_new_tokens + self.config.gamma + 2)
        on_twin = self.target.prefill_graph_for(len(self.prompt_ids))      # all of the prompt, or none
        logits = self.target.forward(self.prompt_ids[kept:], last=1, prefill_graph=on_twin)[-1]
        self.stats.prefill_ms += self.target.last_ms
        self.stats.target_forwards += 1
        raw = logits
        if self.grammar is not None:
            logits = mask_logits(logits[None, :], [self.grammar.allowed()])[0]
        self.last = self.pick(logits)
        if self.logprobs is not None:
            self.logprobs += token_logprobs(raw[None, :], [self.last], self.top_logprobs)
        if self.grammar is not None:
            self.grammar.commit(0, self.last)
        if dc is not None:
            dc.sync(len(dc.ids), [self.last])
        self.stats.ttft_ms = (time.perf_counter() - self.started) * 1e3
        return [self.last]

    def round(self) -> list[int]:
        self.check_current()
        if self.jump_forward:           # the grammar's forced tokens: free drafts (grammar.py)
            forced = self.grammar.forced(min(MAX_FORCED, self.max_new_tokens - len(self.generated) - 1))
            if forced and not self.drafts_on_forced:
                return forced_round(self, forced)
            self.forced = forced        # draft_tokens drafts them first, the drafter after them
        gamma, st, strategy = self.draft_budget(), self.stats, self.strategy
        if gamma and self.strategy_state is not None:
            self.strategy_state.begin_round(self)
        governor = self.setup.governor_for(strategy.source(self.strategy_state) if strategy.source and gamma else None)
        step = self.step
        drafter_round = governor is not None and governor is self.setup.drafter_governor()
        if drafter_round and step.drafter_gamma is not None:
            gamma = min(gamma, step.drafter_gamma)        # the plan's range for drafter rounds
        if governor is not None:
            gamma = governor.choose(gamma)
        if gamma and self.drafter is not None and self.drafter.pending:
            st.drafter_load_ms += self.drafter.build()     # a deferred drafter session: built for this first draft
        fed = self.drafter.tokens_fed if self.drafter is not None else 0
        guesses_before = st.guesses
        t0 = time.perf_counter()
        guess = step.plain_guess and gamma == 0 and (step.free_guess or governor is not None and governor.guess_pays())
        new = speculative_round(self, gamma, guess)
        ms = (time.perf_counter() - t0) * 1e3
        st.gamma_per_step.append(gamma)
        if gamma == 0 and self.config.gamma:
            st.fallback_ms += ms
        if governor is not None:     # a round whose drafter caught up on many tokens (its prefill, or after
            catch_up = self.drafter is not None and self.drafter.tokens_fed - fed > gamma + 2   # plain steps)
            kept = len(new) - 1 if st.guesses > guesses_before else None     # a plain step's guess: 1 kept, 0 not
            drafted, accepted = st.drafted_per_step[-1], st.accepted_per_step[-1]
            governor.update(drafted, accepted, None if catch_up else ms, kept)
            if drafter_round:               # what the planning judges the drafter by (record())
                self.drafter_reached += min(drafted, accepted + 1)
                self.drafter_accepted += accepted
        return new

    def draft_budget(self) -> int:
        """gamma for this round: the draft length, less near max_new_tokens or the drafter's context end."""
        gamma = min(self.config.gamma, self.max_new_tokens - len(self.generated) - 1)
        dc = self.drafter_ctx
        if gamma <= 0 or dc is None:
            return max(gamma, 0)
        if not dc.ids:      # nothing the drafter can condition on (no BOS, only unmapped specials)
            return 0
        if self.drafter.max_position:
            room = self.drafter.max_position - dc.room() - 2
            if room < gamma:
                gamma = max(room, 0)
                self.stats.drafter_fallback_steps += gamma == 0
        return gamma

    def append(self, new: list[int]) -> str | None:
        """Append committed tokens; returns "eos"/"length" when generation must end."""
        for i, t in enumerate(new):
            if t in self.shared.eos_ids:
                self.generated.extend(new[:i + 1])
                self.trim_logprobs()
                return "eos"
        self.generated.extend(new)
        return "length" if len(self.generated) >= self.max_new_tokens else None

    def trim_logprobs(self) -> None:
        """The log-probabilities of the tokens kept, where `generated` was cut (EOS, a stop string)."""
        if self.logprobs is not None:
            del self.logprobs[len(self.generated):]

    # -- helpers for strategies
    def pick(self, logits_row: np.ndarray, offset: int = 0) -> int:
        """The target's token from one row of its logits, the row that predicts output index
        len(generated) + offset: argmax, or a draw from p (coupled: its race there, coupled.py); greedy, the
        row may be the id the graph picked (verify.greedy_id)."""
        if self.params.greedy:
            return greedy_id(logits_row)
        p = probabilities(logits_row[None, :], self.params, out=self.p_rows[:1])
        return self.draw(p[0], offset)

    def draw(self, probs: np.ndarray, offset: int) -> int:
        """One draw from a probability row for output index len(generated) + offset: the race over that
        index's noise when coupled, else inverse CDF from the generation's stream."""
        if self.noise is not None:
            return race_pick(probs, self.noise.at(len(self.generated) + offset, probs.shape[0]))
        return sample(probs, self.rng, self.work[1])

    def draft_forward(self) -> np.ndarray:
        """Drafter forward on what its KV lacks; returns the last row of kept-column logits."""
        ids = self.drafter_ctx.inputs()
        fill = self.starts_fill()
        row = self.drafter.forward(ids, last=1)[-1]
        self.book_draft_forward(was_prefill=fill, tokens=len(ids))
        return row

    def starts_fill(self) -> bool:
        """Whether the drafter forward about to run fills its window: on an empty KV (the first fill or a
        refill), or the generation's first (the rest of a window that prefix reuse kept in part)."""
        return self.stats.draft_forwards == 0 or self.drafter.length == 0

    def book_draft_forward(self, was_prefill: bool, overlap_from: float | None = None, tokens: int = 0) -> None:
        """Drafter time: a forward on an empty KV fills its window (draft_prefill_ms); one that ran beside
        the verify forward (`overlap_from` = when it was submitted) also books the time the two overlapped."""
        ms, st = self.drafter.last_ms, self.stats
        st.draft_forwards += 1
        if overlap_from is not None:
            st.overlap_ms += max(0.0, ms + self.target.last_ms - (time.perf_counter() - overlap_from) * 1e3)
        if was_prefill:
            st.draft_prefill_ms += ms
            st.draft_prefill_tokens += tokens
        else:
            st.draft_ms += ms
            st.draft_ms_steps.append(ms)

    def draft_q(self, row: np.ndarray, out: np.ndarray) -> np.ndarray | None:
        """The strategy's draft distribution over target ids for one drafter row, written into `out`
        (under a grammar: restricted to the tokens it allows; None when it allows none of q's)."""
        t = time.perf_counter()
        q = self.strategy.distribution(self.prepared, row, self.params, out)
        if self.grammar is not None:
            q = mask_distribution(q, self.grammar.allowed())
        self.stats.sampler_ms += (time.perf_counter() - t) * 1e3
        return q

    def draft_greedy(self, row: np.ndarray) -> int:
        """The strategy's temperature-0 draft (a target id) for one drafter row."""
        t = time.perf_counter()
        x = self.strategy.greedy(self.prepared, row) if self.grammar is None else \
            masked_greedy(self, row, self.grammar.allowed())
        self.stats.sampler_ms += (time.perf_counter() - t) * 1e3
        return x
