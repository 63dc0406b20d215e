"""One decode round for every strategy (gpt-fast's `speculative_decode`, mlx-lm's
`speculative_generate_step`): propose -> ONE target forward -> accept -> commit. `speculative_round`
below is the whole of it.

A strategy (strategies.py) supplies `propose` and `accept`. The token-level ones (sd, tli, rdk-taylor,
rdk, and `ar` with gamma = 0) use `draft_tokens` and `accept_tokens` below, so the whole TLI round
reads top to bottom in this file; randomised drafting (randomised.draft_randomised) wraps
`draft_tokens` and finishes its draft through `Draft.finish`. SLEM (slem.py) proposes a re-tokenised
string and accepts by exact match.

State between rounds (`Generation`): the target's KV covers prompt + generated[:-1]; `last`
(= generated[-1]) is fed first in the next verify forward. The drafter's side (context.DrafterContext)
holds the committed text in drafter tokens and the part of it its KV covers; `commit` resyncs it
through `DrafterContext.sync`, and the drafter catches up on whatever its KV lacks at its next forward.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from edgespec.errors import GenerationError
from edgespec.runtime.context import DrafterContext, DrafterWindow
from edgespec.runtime.grammar import GrammarState, mask_distribution, mask_logits, masked_greedy
from edgespec.runtime.lookup import DEFAULT_MAX_N, lookup
from edgespec.runtime.sampling import SamplingParams, probabilities, sample
from edgespec.runtime.stats import GenerationStats
from edgespec.runtime.verify import verify_greedy, verify_sampled


MAX_FORCED = 16             # forced tokens drafted in one round (a wider verify forward costs more)


def _nothing() -> None:
    return None


@dataclass
class Draft:
    """What one round proposes: target ids, and (sampled) the q rows over target ids they were drawn
    from. A q with one row more than `tokens` ends on a no-draft position (randomised drafting), whose
    row `finish` fills in after the verify forward. `keep[j]` is the drafter-context length to keep
    when j proposals are accepted (len(keep) = len(tokens) + 1); `refeed`: the accepted proposals are
    not in the drafter's context yet (string-level drafts, in drafter tokens of their own)."""
    tokens: list[int] = field(default_factory=list)
    q: np.ndarray | None = None
    keep: list[int] = field(default_factory=list)
    refeed: bool = False
    guess: bool = False                 # a plain step's free guess (plain_step), not the strategy's draft
    forced: int = 0                     # leading tokens the grammar forced (jump-forward), not the strategy's draft
    finish: Callable[[], None] = _nothing

    @property
    def terminal(self) -> bool:
        return self.q is not None and len(self.q) > len(self.tokens)


def speculative_round(gen: "Generation", gamma: int, guess: bool = False) -> list[int]:
    """One round; returns the committed target ids (accepted drafts + one target token). `guess`: a
    plain step (gamma = 0) may carry a prompt-lookup guess (plain_step)."""
    if gen.forced:                      # the grammar's forced tokens, then the drafter's (draft_tokens)
        draft, accept = draft_tokens(gen, gamma), accept_tokens
    elif gamma > 0:
        draft, accept = gen.propose(gen, gamma), gen.strategy.accept
    else:
        draft, accept = plain_step(gen, guess), accept_tokens
    try:
        logits = gen.target.forward([gen.last, *draft.tokens], pad=bool(draft.tokens) or gen.config.plain_steps == "exact")
    finally:                            # never leave a drafter forward running behind us
        draft.finish()
    if gen.grammar is not None:         # constrained decoding: verify against the constrained target
        logits = _constrain(gen, logits, draft.tokens)
    n_acc, t = accept(gen, logits, draft)
    commit(gen, draft, n_acc, t)
    return [*draft.tokens[:n_acc], t]


# --------------------------------------------------------------------------- constrained decoding (grammar.py)

def _constrain(gen: "Generation", logits: np.ndarray, drafts: list[int]) -> np.ndarray:
    """The verify rows with the grammar's forbidden tokens at -inf (row j: after drafts[:j])."""
    return mask_logits(logits, gen.grammar.block_masks(drafts))


def forced_round(gen: "Generation", forced: list[int]) -> list[int]:
    """A round whose drafts are only the tokens the grammar forces (jump-forward), for strategies that
    do not draft token by token from a drafter (ar, ngram, slem): no drafter forward, one target
    forward over them, verified like any draft (one-hot q) against the constrained target, so the
    output law is unchanged; a forced token the target tokenises otherwise is simply rejected. (A
    token-level drafter drafts on after them in the same round: draft_tokens.)"""
    draft = lookup_draft(gen, forced)
    draft.forced = len(forced)
    logits = _constrain(gen, gen.target.forward([gen.last, *draft.tokens], pad=True), draft.tokens)
    n_acc, t = accept_tokens(gen, logits, draft)
    commit(gen, draft, n_acc, t)
    return [*draft.tokens[:n_acc], t]


# --------------------------------------------------------------------------- token-level strategies

def draft_tokens(gen: "Generation", gamma: int) -> Draft:
    """Up to gamma drafter forwards; each last row becomes q over target ids (the strategy's
    `distribution`) and a draft is drawn from it (the strategy's `greedy` argmax at temperature 0).
    With draft_confidence, drafting stops where the drafter's top probability falls below it."""
    dc, confidence, greedy = gen.drafter_ctx, gen.config.draft_confidence, gen.params.greedy
    draft = Draft()
    forced, gen.forced = gen.forced, []
    for x in forced:                   # the grammar's forced tokens first: free drafts, one-hot q
        draft.tokens.append(x)
        draft.keep.append(len(dc.ids))
        dc.draft(x)
        if not greedy:
            gen.q_rows[len(draft.tokens) - 1].fill(0.0)
            gen.q_rows[len(draft.tokens) - 1, x] = 1.0
        if not gen.grammar.draft(x):    # (never: llguidance forces allowed tokens) no drafts after it
            gamma = 0
            break
    draft.forced = len(draft.tokens)
    if forced:                         # forced tokens count against the draft length: the drafter fills the rest
        gamma = max(0, min(gamma - len(forced), gen.max_new_tokens - len(gen.generated) - 1 - len(forced)))
    for j in range(gamma):
        row = gen.draft_forward()
        if confidence and j > 0 and _top_probability(row) < confidence:
            break                          # a function of the drafts so far, not of a draw
        if greedy:
            x = gen.draft_greedy(row)
        else:
            q = gen.draft_q(row, gen.q_rows[len(draft.tokens)])
            x = None if q is None else sample(q, gen.rng, gen.work[1])
        if x is None:                      # the grammar allows none of the drafter's tokens
            break
        draft.tokens.append(x)
        draft.keep.append(len(dc.ids))
        dc.draft(x)
        if gen.grammar is not None and not gen.grammar.draft(x):     # the end: drafting stops there
            break
    draft.keep.append(len(dc.ids) if dc is not None else 0)
    draft.q = None if greedy else gen.q_rows[:len(draft.tokens)]
    return draft


def lookup_draft(gen: "Generation", tokens: list[int], guess: bool = False) -> Draft:
    """A draft of given target ids (prompt lookup: ngram.py, plain_step): q is one-hot on each. The
    drafter's context does not take them while drafting; the accepted ones enter it at commit (refeed)."""
    keep = len(gen.drafter_ctx.ids) if gen.drafter_ctx is not None else 0
    draft = Draft(tokens=list(tokens), keep=[keep] * (len(tokens) + 1), refeed=True, guess=guess)
    if not gen.params.greedy:
        draft.q = gen.q_rows[:len(tokens)]
        for j, x in enumerate(tokens):
            draft.q[j].fill(0.0)
            draft.q[j, x] = 1.0
    return draft


def plain_step(gen: "Generation", guess: bool) -> Draft:
    """A round without drafts (gamma = 0). With `guess`, its forward also carries a guess of the token
    after next: the token that followed the latest earlier occurrence of the context's last n tokens
    (lookup.py), verified like any draft. A kept guess commits 2 tokens for one forward. Where the target
    pads a 1-token step anyway (kv.py: min_forward_tokens) the guess takes the padded position and costs
    nothing; elsewhere it makes the forward 2 tokens wide, and the governor decides whether that pays
    (Governor.guess_pays). No match, or no room for 2 tokens: a plain step."""
    if guess and gen.max_new_tokens - len(gen.generated) >= 2:
        found, _ = lookup(np.asarray(gen.prompt_ids + gen.generated, dtype=np.int64), gen.lookup_max_n, 1)
        if found:
            return lookup_draft(gen, found, guess=True)
    return draft_tokens(gen, 0)


def _top_probability(kept_logits: np.ndarray) -> float:
    """The drafter's top probability over its kept columns (softmax at temperature 1)."""
    x = kept_logits - kept_logits.max()
    return float(1.0 / np.exp(x, out=x).sum())


def accept_tokens(gen: "Generation", logits: np.ndarray, draft: Draft) -> tuple[int, int]:
    """verify.py: greedy (accept while the draft is the target's argmax) or rejection sampling against
    the draft's q rows (with the randomised rule when a < 1)."""
    d = np.asarray(draft.tokens, dtype=np.int64)
    if gen.params.greedy:
        return verify_greedy(logits, d)
    p = probabilities(logits, gen.params, out=gen.p_rows[:len(d) + 1])
    a = 1.0 if gen.config.draft_probability is None else gen.config.draft_probability
    return verify_sampled(p, draft.q, d, gen.rng, a, draft.terminal, work=gen.work)


# --------------------------------------------------------------------------- commit

def commit(gen: "Generation", draft: Draft, n_acc: int, t: int) -> None:
    """Keep n_acc proposals + t: crop the target's KV to them (a position reset), book the block, set
    `last`, and resync the drafter (DrafterContext.sync: its context back to keep[n_acc], then the
    committed tail)."""
    gen.target.crop(gen.target.length - (len(draft.tokens) - n_acc))
    gen.stats.record_verify(len(draft.tokens) + 1, gen.target.last_ms)
    if gen.grammar is not None:
        gen.grammar.commit(n_acc, t)
    if draft.forced:                    # the grammar's forced tokens: booked apart (stats.py)
        gen.stats.record_forced(draft.forced, min(n_acc, draft.forced))
    if draft.guess:                     # not the strategy's draft: booked apart (stats.py)
        gen.stats.record_block(0, 0)
        gen.stats.record_guess(n_acc)
    else:                               # the strategy's drafts, after any forced ones
        gen.stats.record_block(len(draft.tokens) - draft.forced, max(0, n_acc - draft.forced))
    gen.last = t
    if gen.drafter_ctx is not None:
        gen.drafter_ctx.sync(draft.keep[n_acc], [*draft.tokens[:n_acc], t] if draft.refeed else [t])


# --------------------------------------------------------------------------- state of one generation

class Generation:
    """Mutable state of one generate/stream call: runners, committed ids, sampling, stats, and the
    strategy's per-generation state (`Strategy.start`)."""

    def __init__(self, dec, prompt_ids: list[int], params: SamplingParams, rng: np.random.Generator,
                 max_new_tokens: int, generation_id: int, propose: Callable | None = None,
                 grammar: GrammarState | None = None, jump_forward: bool = True):
        self.dec = dec                       # generation_id, governor_for, side_runner, prefix_cache
        self.config = cfg = dec.config
        self.strategy = cfg.strategy
        self.propose = propose or cfg.strategy.propose      # randomised drafting passes its own
        self.prepared = dec.prepared         # what strategy.prepare computed once per decoder
        self.prompt_ids = prompt_ids
        self.params = params
        self.rng = rng
        self.max_new_tokens = max_new_tokens
        self.target = dec.target
        self.drafter = dec.drafter
        self.q_rows, self.p_rows, self.work = dec.scratch     # per-round arrays, reused by every round
        self.drafter_ctx = None
        if dec.text_context is not None:
            d = dec.bundle.drafter
            window = DrafterWindow(cfg.drafter_window, d.bos_id if d.add_bos else None)
            self.drafter_ctx = DrafterContext(dec.text_context, dec.drafter, window)
        # plain steps of a speculative strategy may carry a lookup guess (plain_step): with a governor when
        # it pays, without one where the target pads the step anyway (free)
        self.plain_guess = cfg.plain_guess and cfg.strategy.speculative and cfg.draft_probability is None
        self.free_guess = cfg.plain_steps == "exact" and dec.target.min_tokens >= 2
        self.lookup_max_n = int(cfg.options.get("ngram_max_n", DEFAULT_MAX_N))
        self.generated: list[int] = []
        self.last = -1
        self.id = generation_id
        self.stats = GenerationStats(strategy=cfg.strategy.name, draft_length=cfg.gamma,
                                     draft_length_setting=cfg.draft_length if cfg.gamma else 0,
                                     prompt_tokens=len(prompt_ids), providers=dec.providers)
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

    def check_current(self) -> None:
        if self.id != self.dec.generation_id:
            raise GenerationError("this stream was superseded by a newer generate/stream call on the same decoder")

    # -- phases
    def prefill(self) -> list[int]:
        """The target runs the prompt (after the prefix its KV kept from the previous call: prefix.py)
        and picks the first token; the drafter's context is set up, and its window filled at its first
        forward (context.DrafterWindow), not here: TTFT waits for the target only."""
        self.check_current()
        cache, reuse, dc = self.dec.prefix_cache, self.config.prefix_reuse, self.drafter_ctx
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
        cache.forget()                # until this generation ends normally (decoder._run)
        self.stats.reused_tokens = kept
        self.target.reserve(len(self.prompt_ids) + self.max_new_tokens + self.config.gamma + 2)
        on_twin = self.target.prefill_graph_for(len(self.prompt_ids))      # all of the prompt, or none
        logits = self.target.forward(self.prompt_ids[kept:], last=1, prefill_graph=on_twin)[-1]
        self.stats.prefill_ms += self.target.last_ms
        self.stats.target_forwards += 1
        if self.grammar is not None:
            logits = mask_logits(logits[None, :], [self.grammar.allowed()])[0]
        self.last = self.pick(logits)
        if self.grammar is not None:
            self.grammar.commit(0, self.last)
        if dc is not None:
            dc.sync(len(dc.ids), [self.last])
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
        governor = self.dec.governor_for(strategy.source(self.strategy_state) if strategy.source and gamma else None)
        if governor is not None:
            gamma = governor.choose(gamma)
        if gamma and self.drafter is not None and self.drafter.pending:
            st.drafter_load_ms += self.drafter.build()     # a deferred drafter session: built for this first draft
        fed = self.drafter.tokens_fed if self.drafter is not None else 0
        guesses_before = st.guesses
        t0 = time.perf_counter()
        guess = self.plain_guess and gamma == 0 and (self.free_guess or governor is not None and governor.guess_pays())
        new = speculative_round(self, gamma, guess)
        ms = (time.perf_counter() - t0) * 1e3
        st.gamma_per_step.append(gamma)
        if gamma == 0 and self.config.gamma:
            st.fallback_ms += ms
        if governor is not None:     # a round whose drafter caught up on many tokens (its prefill, or after
            catch_up = self.drafter is not None and self.drafter.tokens_fed - fed > gamma + 2   # plain steps)
            kept = len(new) - 1 if st.guesses > guesses_before else None     # a plain step's guess: 1 kept, 0 not
            governor.update(st.drafted_per_step[-1], st.accepted_per_step[-1], None if catch_up else ms, kept)
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
        p = probabilities(logits_row[None, :], self.params, out=self.p_rows[:1])
        return sample(p[0], self.rng, self.work[1])

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
