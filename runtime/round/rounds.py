"""One decode round for every strategy (gpt-fast's `speculative_decode`, mlx-lm's
`speculative_generate_step`): propose -> ONE target forward -> accept -> commit. `speculative_round`
below is the whole of it.

A strategy (strategies.py) supplies `propose` and `accept`. The token-level ones (sd, tli, rdk-taylor,
rdk, and `ar` with gamma = 0) use `draft_tokens` and `accept_tokens` below, so the whole TLI round
reads top to bottom in this file; randomised drafting (randomised.draft_randomised) wraps
`draft_tokens` and finishes its draft through `Draft.finish`. SLEM (slem.py) proposes a re-tokenised
string and accepts by exact match.

A round's state is the generation's (generation.Generation: the target's KV covers prompt +
generated[:-1]; `last` = generated[-1] is fed first in the next verify forward); `commit` resyncs the
drafter's side through `DrafterContext.sync`, and the drafter catches up on whatever its KV lacks at its
next forward.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from edgespec.runtime.samplers.grammar import mask_logits
from edgespec.runtime.samplers.logprobs import token_logprobs
from edgespec.runtime.samplers.lookup import lookup, with_store
from edgespec.runtime.samplers.coupled import verify_coupled
from edgespec.runtime.samplers.sampling import probabilities
from edgespec.runtime.samplers.verify import verify_greedy, verify_sampled


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
    store: bool = False                 # drafted from the answer store (lookup.with_store)
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
    # greedy and unconstrained, a round reads only each row's argmax: the graph's own, where it has one
    # (unless the caller wants log-probabilities, which need the rows)
    greedy = gen.params.greedy and gen.grammar is None and gen.logprobs is None
    try:
        logits = gen.target.forward([gen.last, *draft.tokens], pad=gen.step.pads(len(draft.tokens)), greedy=greedy)
    finally:                            # never leave a drafter forward running behind us
        draft.finish()
    raw = logits
    if gen.grammar is not None:         # constrained decoding: verify against the constrained target
        logits = _constrain(gen, logits, draft.tokens)
    n_acc, t = accept(gen, logits, draft)
    return _committed(gen, draft, n_acc, t, raw)


def _committed(gen: "Generation", draft: Draft, n_acc: int, t: int, raw: np.ndarray) -> list[int]:
    """Commit the round; the committed ids, their log-probabilities (logprobs.py) read off the raw verify
    rows first where asked (the runner's output buffers are reused by the next forward)."""
    new = [*draft.tokens[:n_acc], t]
    if gen.logprobs is not None:
        gen.logprobs += token_logprobs(raw, new, gen.top_logprobs)
    commit(gen, draft, n_acc, t)
    return new


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
    raw = gen.target.forward([gen.last, *draft.tokens], pad=True)
    n_acc, t = accept_tokens(gen, _constrain(gen, raw, draft.tokens), draft)
    return _committed(gen, draft, n_acc, t, raw)


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
            x = None if q is None else gen.draw(q, len(draft.tokens))
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


def lookup_draft(gen: "Generation", tokens: list[int], guess: bool = False, store: bool = False) -> Draft:
    """A draft of given target ids (prompt lookup: ngram.py, plain_step): q is one-hot on each. The
    drafter's context does not take them while drafting; the accepted ones enter it at commit (refeed)."""
    keep = len(gen.drafter_ctx.ids) if gen.drafter_ctx is not None else 0
    draft = Draft(tokens=list(tokens), keep=[keep] * (len(tokens) + 1), refeed=True, guess=guess, store=store)
    if not gen.params.greedy:
        draft.q = gen.q_rows[:len(tokens)]
        for j, x in enumerate(tokens):
            draft.q[j].fill(0.0)
            draft.q[j, x] = 1.0
    return draft


def plain_step(gen: "Generation", guess: bool) -> Draft:
    """A round without drafts (gamma = 0). With `guess`, its forward also carries a guess of the token
    after next: the token that followed the latest earlier occurrence of the context's last n tokens
    (lookup.py; or in earlier answers: lookup.with_store), verified like any draft. A kept guess commits
    2 tokens for one forward. Where the target pads a 1-token step anyway (kv.py: min_forward_tokens) the
    guess takes the padded position and costs nothing; elsewhere it makes the forward 2 tokens wide, and
    the governor decides whether that pays (Governor.guess_pays). No match, or no room for 2 tokens: a plain step."""
    if guess and gen.max_new_tokens - len(gen.generated) >= 2:
        history = np.asarray(gen.prompt_ids + gen.generated, dtype=np.int64)
        found, n = lookup(history, gen.lookup_max_n, 1, view=gen.lookup_view)   # or the store's, longer:
        found, n, stored = with_store(gen.shared.answers, gen.draft_scope, history, found, n, 1)
        if found:
            return lookup_draft(gen, found, guess=True, store=stored)
    return draft_tokens(gen, 0)


def _top_probability(kept_logits: np.ndarray) -> float:
    """The drafter's top probability over its kept columns (softmax at temperature 1)."""
    x = kept_logits - kept_logits.max()
    return float(1.0 / np.exp(x, out=x).sum())


def accept_tokens(gen: "Generation", logits: np.ndarray, draft: Draft) -> tuple[int, int]:
    """verify.py: greedy (accept while the draft is the target's argmax) or rejection sampling against
    the draft's q rows (with the randomised rule when a < 1); seeded, coupled.py: accept while the draft
    is the target's own race pick. `logits`: the verify rows, or at temperature 0 their argmax ids (the
    forward's greedy=True)."""
    d = np.asarray(draft.tokens, dtype=np.int64)
    if gen.params.greedy:
        return verify_greedy(logits, d)
    p = probabilities(logits, gen.params, out=gen.p_rows[:len(d) + 1])
    if gen.noise is not None:
        return verify_coupled(p, d, gen.noise, len(gen.generated))
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
    if draft.store:                     # the answer store's drafts (or guess): booked apart too (stats.py)
        gen.stats.record_store(len(draft.tokens), n_acc)
    if draft.guess:                     # not the strategy's draft: booked apart (stats.py)
        gen.stats.record_block(0, 0)
        gen.stats.record_guess(n_acc)
    else:                               # the strategy's drafts, after any forced ones
        gen.stats.record_block(len(draft.tokens) - draft.forced, max(0, n_acc - draft.forced))
    gen.last = t
    if gen.drafter_ctx is not None:
        gen.drafter_ctx.sync(draft.keep[n_acc], [*draft.tokens[:n_acc], t] if draft.refeed else [t])
