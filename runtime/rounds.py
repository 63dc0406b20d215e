"""One decode round for every strategy (gpt-fast's `speculative_decode`, mlx-lm's
`speculative_generate_step`): draft -> ONE target forward -> accept -> commit/roll back.

    def speculative_round(gen, gamma):
        draft = propose(gen, gamma)                  # 1. the drafter proposes target ids
        logits = target.forward([last, *draft])      # 2. one verify forward: len(draft) + 1 rows
        n_acc, t = accept(gen, logits, draft)        # 3. accept a prefix, emit one more token
        rollback(gen, draft, n_acc, t)               # 4. crop both KV caches, sync the drafter's context

A strategy (strategies.py) supplies `propose` and `accept`. The token-level ones (sd, tli, rdk-taylor,
rdk, any of them with randomised drafting, and `ar` with gamma = 0) use `draft_tokens` and
`accept_tokens` below, so the whole TLI round reads top to bottom in this file. SLEM (slem.py)
proposes a re-tokenised string and accepts by exact match.

State between rounds (`Generation`): the target's KV covers prompt + generated[:-1]; `last`
(= generated[-1]) is fed first in the next verify forward. The drafter's KV covers
ctx.ids[:drafter.length], where ctx.ids is the committed text in drafter tokens (context.py); the
drafter catches up on whatever its KV lacks at its next forward.
"""
from __future__ import annotations

import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from types import SimpleNamespace

import numpy as np

from edgespec.errors import GenerationError
from edgespec.runtime.context import DrafterWindow
from edgespec.runtime.randomised import chain_length
from edgespec.runtime.sampling import SamplingParams, probabilities, sample
from edgespec.runtime.stats import GenerationStats
from edgespec.runtime.verify import verify_greedy, verify_sampled


@dataclass
class Draft:
    """What one round proposes. `keep[j]` is the drafter-context length to keep when j proposals are
    accepted (len(keep) = len(tokens) + 1); `refeed`: the accepted proposals are not in the drafter's
    context yet (string-level drafts, in drafter tokens of their own) and must be appended with t."""
    tokens: list[int] = field(default_factory=list)
    keep: list[int] = field(default_factory=list)
    refeed: bool = False
    terminal: bool = False              # randomised drafting: the block ends on a no-draft position ...
    pending: Future | None = None       # ... whose q is computed beside the verify forward
    pending_prefill: bool = False       # that forward is the drafter's prefill
    t_submit: float | None = None       # when it was handed to the worker thread (concurrent_draft)


def speculative_round(gen: "Generation", gamma: int) -> list[int]:
    """One round; returns the committed target ids (accepted drafts + one target token)."""
    strategy = gen.dec.strategy if gamma > 0 else TOKEN_LEVEL
    draft = strategy.propose(gen, gamma)
    try:
        logits = gen.target.forward([gen.last, *draft.tokens], pad=bool(draft.tokens) or gen.dec.plain_steps == "exact")
    finally:                            # never leave the drafter running behind us
        no_draft_row = draft.pending.result()[-1] if draft.pending is not None else None
    gen.stats.record_verify(len(draft.tokens) + 1, gen.target.last_ms)
    if no_draft_row is not None:
        gen.book_draft_forward(draft.pending_prefill, overlap_from=draft.t_submit)
        gen.draft_q(no_draft_row, len(draft.tokens))
    n_acc, t = strategy.accept(gen, logits, draft)
    rollback(gen, draft, n_acc, t)
    return [*draft.tokens[:n_acc], t]


# --------------------------------------------------------------------------- token-level strategies

def draft_tokens(gen: "Generation", gamma: int) -> Draft:
    """Up to gamma drafter forwards; each last row becomes q over target ids (the strategy's
    `distribution`) and a draft is drawn from it (the strategy's `greedy` argmax at temperature 0).
    Randomised drafting flips its per-position coins first (randomised.py): n drafts, then, when a coin
    said "no draft", that position's q is still needed; its drafter forward runs beside the verify."""
    ctx, dec, rng = gen.ctx, gen.dec, gen.rng
    draft = Draft()
    n, draft.terminal = gamma, False
    if dec.draft_probability is not None and not gen.params.greedy:
        n, draft.terminal = chain_length(rng, dec.draft_probability, gamma)
    for j in range(n):
        row = gen.draft_forward()
        if dec.draft_confidence and j > 0 and _top_probability(row) < dec.draft_confidence:
            draft.terminal = False         # confidence stop: a function of the drafts so far, not of a draw
            break
        x = gen.draft_greedy(row) if gen.params.greedy else sample(gen.draft_q(row, j), rng, dec.work[1])
        draft.tokens.append(x)
        draft.keep.append(len(ctx.ids))
        ctx.ids.extend(ctx.feed_ids(x))
    if draft.terminal:
        pending = gen.drafter_input()
        draft.pending_prefill = gen.drafter.length == 0
        if dec.concurrent_draft:
            draft.t_submit = time.perf_counter()
            draft.pending = dec.side_runner().submit(gen.drafter.forward, pending, 1)    # last row only
        else:
            draft.pending = _done(gen.drafter.forward(pending, 1))
    draft.keep.append(len(ctx.ids) if ctx is not None else 0)
    return draft


def lookup_draft(gen: "Generation", tokens: list[int]) -> Draft:
    """A draft of given target ids (prompt lookup, ngram.py): q is one-hot on each; the drafter's
    context, if there is a drafter, takes them like its own drafts."""
    ctx, draft = gen.ctx, Draft(tokens=list(tokens))
    for j, x in enumerate(tokens):
        if not gen.params.greedy:
            q = gen.dec.q_rows[j]
            q.fill(0.0)
            q[x] = 1.0
        if ctx is not None:
            draft.keep.append(len(ctx.ids))
            ctx.ids.extend(ctx.feed_ids(x))
    draft.keep.append(len(ctx.ids)) if ctx is not None else draft.keep.extend([0] * (len(tokens) + 1))
    return draft


def _top_probability(kept_logits: np.ndarray) -> float:
    """The drafter's top probability over its kept columns (softmax at temperature 1)."""
    x = kept_logits - kept_logits.max()
    return float(1.0 / np.exp(x, out=x).sum())


def accept_tokens(gen: "Generation", logits: np.ndarray, draft: Draft) -> tuple[int, int]:
    """verify.py: greedy (accept while the draft is the target's argmax) or rejection sampling against
    the q rows the drafts were drawn from (with the randomised rule when a < 1)."""
    dec, n = gen.dec, len(draft.tokens)
    d = np.asarray(draft.tokens, dtype=np.int64)
    if gen.params.greedy:
        return verify_greedy(logits, d)
    p = probabilities(logits, gen.params, out=dec.p_rows[:n + 1])
    a = 1.0 if dec.draft_probability is None else dec.draft_probability
    return verify_sampled(p, dec.q_rows[:n + draft.terminal], d, gen.rng, a, draft.terminal, work=dec.work)


TOKEN_LEVEL = SimpleNamespace(propose=draft_tokens, accept=accept_tokens)   # any strategy's round at gamma = 0


# --------------------------------------------------------------------------- commit / roll back

def rollback(gen: "Generation", draft: Draft, n_acc: int, t: int) -> None:
    """Keep n_acc proposals + t: crop the target's KV to them, cut the drafter's context back to
    keep[n_acc], append the committed tail in drafter tokens, and keep the drafter KV that the new
    context still matches (a re-tokenisation may change earlier drafter tokens: context.py)."""
    gen.target.crop(gen.target.length - (len(draft.tokens) - n_acc))
    gen.stats.record_block(len(draft.tokens), n_acc)
    gen.last = t
    ctx = gen.ctx
    if ctx is None:
        return
    keep = draft.keep[n_acc]
    fed = ctx.ids[keep:gen.window.covered(gen.drafter.length)]     # tokens already in the drafter's KV
    del ctx.ids[keep:]
    valid = keep
    for tok in [*draft.tokens[:n_acc], t] if draft.refeed else [t]:
        valid = min(valid, ctx.append_target(tok))
    if valid == keep:
        same = 0
        while same < len(fed) and keep + same < len(ctx.ids) and ctx.ids[keep + same] == fed[same]:
            same += 1
        valid += same
    gen.window.keep_valid(valid, gen.drafter)


def _done(value) -> Future:
    f = Future()
    f.set_result(value)
    return f


# --------------------------------------------------------------------------- state of one generation

class Generation:
    """Mutable state of one generate/stream call: runners, committed ids, sampling, stats."""

    def __init__(self, dec, prompt_ids: list[int], params: SamplingParams, rng: np.random.Generator,
                 max_new_tokens: int, generation_id: int):
        self.dec = dec
        self.prompt_ids = prompt_ids
        self.params = params
        self.rng = rng
        self.max_new_tokens = max_new_tokens
        self.target = dec.target
        self.drafter = dec.drafter
        self.ctx = dec.ctx
        d = dec.bundle.drafter if dec.ctx is not None else None
        self.window = DrafterWindow(dec.drafter_window, d.bos_id if d.add_bos else None) if d is not None else None
        self.generated: list[int] = []
        self.last = -1
        self.id = generation_id
        self.ngram_found: list[int] | None = None      # ngram.source's lookup, for this round's propose
        self.ngram_hit_rate, self.ngram_plain = 1.0, False   # ngram-tli's lookup mode (ngram.py)
        self.stats = GenerationStats(strategy=dec.strategy.name, draft_length=dec.draft_length,
                                     draft_length_setting=dec.draft_length_setting if dec.draft_length else 0,
                                     prompt_tokens=len(prompt_ids), providers=dec.providers)

    def check_current(self) -> None:
        if self.id != self.dec.generation_id:
            raise GenerationError("this stream was superseded by a newer generate/stream call on the same decoder")

    # -- phases
    def prefill(self) -> list[int]:
        """The target runs the prompt (after the prefix its KV kept from the previous call: prefix.py)
        and picks the first token; the drafter's context is set up, and its window filled at its first
        forward (context.DrafterWindow), not here: TTFT waits for the target only."""
        self.check_current()
        cache, reuse = self.dec.prefix_cache, self.dec.prefix_reuse
        kept = cache.target_reuse(self.prompt_ids, self.target) if reuse else self.target.reset() or 0
        if self.drafter is not None:
            self.ctx.start(self.prompt_ids)
            if reuse:
                cache.drafter_reuse(self.ctx.ids, self.drafter, self.window)
            else:
                self.drafter.reset()
        cache.forget()                # until this generation ends normally (decoder._run)
        self.stats.reused_tokens = kept
        self.target.reserve(len(self.prompt_ids) + self.max_new_tokens + self.dec.draft_length + 2)
        logits = self.target.forward(self.prompt_ids[kept:], last=1)[-1]
        self.stats.prefill_ms += self.target.last_ms
        self.stats.target_forwards += 1
        self.last = self.pick(logits)
        if self.drafter is not None:
            self.window.keep_valid(self.ctx.append_target(self.last), self.drafter)
        return [self.last]

    def round(self) -> list[int]:
        self.check_current()
        gamma, st, strategy = self.draft_budget(), self.stats, self.dec.strategy
        governor = self.dec.governor_for(strategy.source(self) if strategy.source and gamma else None)
        if governor is not None:
            gamma = governor.choose(gamma)
        fed = self.drafter.tokens_fed if self.drafter is not None else 0
        t0 = time.perf_counter()
        new = speculative_round(self, gamma)
        ms = (time.perf_counter() - t0) * 1e3
        st.gamma_per_step.append(gamma)
        if gamma == 0 and self.dec.draft_length:
            st.fallback_ms += ms
        if governor is not None:     # a round whose drafter caught up on many tokens (its prefill, or after
            catch_up = self.drafter is not None and self.drafter.tokens_fed - fed > gamma + 2   # plain steps)
            governor.update(st.drafted_per_step[-1], st.accepted_per_step[-1], None if catch_up else ms)
        return new

    def draft_budget(self) -> int:
        """gamma for this round: the draft length, less near max_new_tokens or the drafter's context end."""
        gamma = min(self.dec.draft_length, self.max_new_tokens - len(self.generated) - 1)
        if gamma <= 0 or self.ctx is None:
            return max(gamma, 0)
        if not self.ctx.ids:      # nothing the drafter can condition on (no BOS, only unmapped specials)
            return 0
        if self.drafter.max_position:
            room = self.drafter.max_position - self.window.room(len(self.ctx.ids)) - 2
            if room < gamma:
                gamma = max(room, 0)
                self.stats.drafter_fallback_steps += gamma == 0
        return gamma

    def commit(self, new: list[int]) -> str | None:
        """Append committed tokens; returns "eos"/"length" when generation must end."""
        for i, t in enumerate(new):
            if t in self.dec.eos_ids:
                self.generated.extend(new[:i + 1])
                return "eos"
        self.generated.extend(new)
        return "length" if len(self.generated) >= self.max_new_tokens else None

    # -- helpers for strategies
    def pick(self, logits_row: np.ndarray) -> int:
        """A token from one row of target logits (argmax, or a draw from p)."""
        if self.params.greedy:
            return int(np.argmax(logits_row))
        p = probabilities(logits_row[None, :], self.params, out=self.dec.p_rows[:1])
        return sample(p[0], self.rng, self.dec.work[1])

    def drafter_input(self) -> list[int]:
        """The drafter tokens its KV lacks within its window (context.DrafterWindow); when it lacks none
        (an emitted special had no drafter id), the last one is re-run for fresh logits."""
        return self.window.inputs(self.ctx.ids, self.drafter)

    def draft_forward(self) -> np.ndarray:
        """Drafter forward on what its KV lacks; returns the last row of kept-column logits."""
        ids = self.drafter_input()
        row = self.drafter.forward(ids, last=1)[-1]
        self.book_draft_forward(was_prefill=self.drafter.length == len(ids), tokens=len(ids))
        return row

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

    def draft_q(self, row: np.ndarray, j: int) -> np.ndarray:
        """The strategy's draft distribution over target ids for one drafter row, into q_rows[j]."""
        t = time.perf_counter()
        q = self.dec.strategy.distribution(self.dec.state, row, self.params, self.dec.q_rows[j])
        self.stats.sampler_ms += (time.perf_counter() - t) * 1e3
        return q

    def draft_greedy(self, row: np.ndarray) -> int:
        """The strategy's temperature-0 draft (a target id) for one drafter row."""
        t = time.perf_counter()
        x = self.dec.strategy.greedy(self.dec.state, row)
        self.stats.sampler_ms += (time.perf_counter() - t) * 1e3
        return x
