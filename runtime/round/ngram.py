"""Prompt-lookup drafting (`ngram`): draft the continuation of the latest earlier occurrence of the
last n tokens (n = max_n .. 1) of prompt + output; no drafter model.

The draft distribution is one-hot on the proposed token, so verify.py's rejection sampling accepts d
with probability min(1, p(d)) = p(d) and otherwise draws from norm(max(p - onehot(d), 0)), which is
p conditioned on "not d": the emitted token has law p(d) 1[d] + (1 - p(d)) p(.|not d) = p. Greedy
verification accepts while d is the target's argmax. Lossless either way.

`ngram-tli` combines it with the model drafter. While the lookup keeps finding matches of 2+
tokens (a hit-rate EMA over recent rounds >= 1/2, as in editing, where the answer copies the prompt)
it drafts like `ngram`, and a round without a match is a plain step: the drafter is not run, so it
never pays for its prefill or for catching up on the copied text (about 3.5 ms a token for the int4
0.5B drafter, as much as the lookup saves). Once such matches are rare it drafts with the drafter,
except where a match of 2+ tokens exists. The rate starts at 1, so a prompt that is copied never
starts the drafter. All of it is a function of committed tokens, so every round stays a valid
speculative round.

Beside the prompt, the decoder's answer store (answer_store.py: earlier requests' prompts and answers,
in this call's draft_scope) is searched each round; its continuation replaces the prompt's when it
matches a longer suffix of STORE_MIN_MATCH+ tokens. Once found, an occurrence is followed round after
round while the output goes on as it does (no new lookup; the match grows). A store draft is at most
as long as its match, and within that as long as the store's cost model says pays on this machine
(AnswerStore.draft_length: expected tokens of its acceptance over the verify cost of that width), not
capped by the governor's gamma; under ngram-tli its rounds have a governor of their own ("store"),
which only says whether to draft. The length is a function of past rounds only (as the governor's), its
drafts are one-hot like the prompt's (the same argument), and are booked in stats' store_drafted /
store_accepted.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from edgespec.errors import GenerationError
from edgespec.runtime.samplers.answer_store import MAX_MATCH, MAX_STORE_DRAFT, Match
from edgespec.runtime.samplers.lookup import DEFAULT_MAX_N, lookup, store_wins
from edgespec.runtime.round.rounds import Draft, draft_tokens, lookup_draft

COMBINED_MIN_N = 2          # ngram-tli in drafter mode: a 1-token match is a weaker guess than the drafter's
HIT_EMA = 0.25              # ngram-tli: weight of this round in the lookup's hit rate
LOOKUP_MODE = 0.5           # ngram-tli: hit rate at or above which it drafts like `ngram`


def check(bundle, options) -> None:
    n = (options or {}).get("ngram_max_n", DEFAULT_MAX_N)
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise GenerationError(f"ngram_max_n must be an integer >= 1, got {n!r}")


@dataclass
class LookupState:
    """One generation's prompt-lookup state (Strategy.start): the hit-rate average of ngram-tli's mode,
    and this round's lookup (`begin_round`, once a round, before the governor reads `source`)."""
    max_n: int
    hit_rate: float = 1.0           # EMA of "the lookup found a match of COMBINED_MIN_N+ tokens"
    found: list[int] = field(default_factory=list)     # this round's continuation, up to the draft length
    plain: bool = False             # ngram-tli in lookup mode: a round without a usable match is a plain step
    stored: bool = False            # this round's continuation comes from the answer store
    match: Match | None = None      # the store occurrence the context follows (answer_store.Match)
    seen: int = 0                   # len(generated) when `match` was last moved
    booked: tuple = (0, 0)          # stats' (store_drafted, store_accepted) already booked in the store
    timed: dict = field(default_factory=dict)           # verify forwards per width already observed

    def begin_round(self, gen) -> None:
        history = np.asarray(gen.prompt_ids + gen.generated, dtype=np.int64)
        found, n = lookup(history, self.max_n, gen.config.gamma, view=gen.lookup_view)
        self.stored = False
        store = gen.shared.answers
        if store is not None and store.docs:
            got, m = self.from_store(gen, store, history)
            if store_wins(n, m):
                found, n, self.stored = got, m, True
        if gen.drafter is None:
            self.found = found
            return
        lookup_mode = self.hit_rate >= LOOKUP_MODE
        hit = float(n >= COMBINED_MIN_N)                 # 1-token matches are everywhere, even in new text
        self.hit_rate += HIT_EMA * (hit - self.hit_rate)
        self.plain = lookup_mode
        self.found = found if lookup_mode or n >= COMBINED_MIN_N else []

    def from_store(self, gen, store, history: np.ndarray) -> tuple[list[int], int]:
        """(the store's continuation of the context, sized by its cost model; the match length): the
        occurrence followed since an earlier round when the context went on as it does (no hash lookup),
        else the longest suffix found (answer_store.AnswerStore.find). Books the last round's store
        drafts and verify timings first (what the length model learns from)."""
        st = gen.stats
        drafted, kept = st.store_drafted - self.booked[0], st.store_accepted - self.booked[1]
        if drafted:
            store.book(drafted, kept)
        for k, ms in st.verify_ms_by_k.items():         # the forwards timed since (one a round)
            if len(ms) > self.timed.get(k, 0):
                store.observe(k, ms[-1])
                self.timed[k] = len(ms)
        self.booked = (st.store_drafted, st.store_accepted)
        new = gen.generated[self.seen:]
        self.seen = len(gen.generated)
        match = store.follow(self.match, new) if self.match is not None else None
        self.match = match = match or store.find(history[-MAX_MATCH:].tolist(), gen.draft_scope)
        if match is None:
            return [], 0
        # a store draft's width: its match length, the tokens left, the round's rows (sampled), the cost model
        cap = min(match.m, MAX_STORE_DRAFT, gen.max_new_tokens - len(gen.generated) - 1)
        if not gen.params.greedy:
            cap = min(cap, gen.p_rows.shape[0] - 1)
        best = store.draft_length(cap, gen.step.verify_ms)
        return store.continuation(match, min(cap, gen.config.gamma) if best is None else best), match.m


def start(gen) -> LookupState:
    return LookupState(gen.lookup_max_n)


def source(state: LookupState) -> str:
    """ngram-tli: "store" for a draft from the answer store, "ngram" for a prompt-lookup draft or a
    lookup-mode plain step, else "drafter". Each has its own draft-length governor (draft_length="auto"):
    a long n-gram draft costs one verify forward, a drafter draft a drafter forward per token, and a
    store draft, kept far more often than either, is not held back by their acceptance (its length is
    its own cost model's: LookupState.from_store)."""
    if state.stored and state.found:
        return "store"
    return "ngram" if state.found or state.plain else "drafter"


def propose(gen, gamma: int) -> Draft:
    """The n-gram continuation when there is one; else a plain step (`ngram`, or ngram-tli in lookup
    mode) or the drafter's draft (ngram-tli)."""
    state = gen.strategy_state
    found = state.found if state.stored else state.found[:gamma]     # a store draft is sized by its cost model
    if found or gen.drafter is None or state.plain:
        return lookup_draft(gen, found, store=state.stored and bool(found))
    return draft_tokens(gen, gamma)
