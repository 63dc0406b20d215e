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
matches a longer suffix, as long as its match (lookup.with_store). Its drafts are one-hot like the
prompt's (the same argument), and are booked in stats' store_drafted / store_accepted.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from edgespec.errors import GenerationError
from edgespec.runtime.lookup import DEFAULT_MAX_N, lookup, with_store
from edgespec.runtime.rounds import Draft, draft_tokens, lookup_draft

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

    def begin_round(self, gen) -> None:
        history = np.asarray(gen.prompt_ids + gen.generated, dtype=np.int64)
        found, n = lookup(history, self.max_n, gen.config.gamma)
        found, n, self.stored = with_store(gen.shared.answers, gen.draft_scope, history, found, n, gen.config.gamma)
        if gen.drafter is None:
            self.found = found
            return
        lookup_mode = self.hit_rate >= LOOKUP_MODE
        hit = float(n >= COMBINED_MIN_N)                 # 1-token matches are everywhere, even in new text
        self.hit_rate += HIT_EMA * (hit - self.hit_rate)
        self.plain = lookup_mode
        self.found = found if lookup_mode or n >= COMBINED_MIN_N else []


def start(gen) -> LookupState:
    return LookupState(gen.lookup_max_n)


def source(state: LookupState) -> str:
    """ngram-tli: "ngram" for an n-gram draft or a lookup-mode plain step, else "drafter". The two
    have their own draft-length governors (draft_length="auto"): a long n-gram draft costs one verify
    forward, a drafter draft a drafter forward per token."""
    return "ngram" if state.found or state.plain else "drafter"


def propose(gen, gamma: int) -> Draft:
    """The n-gram continuation when there is one; else a plain step (`ngram`, or ngram-tli in lookup
    mode) or the drafter's draft (ngram-tli)."""
    state = gen.strategy_state
    found = state.found[:gamma]
    if found or gen.drafter is None or state.plain:
        return lookup_draft(gen, found, store=state.stored and bool(found))
    return draft_tokens(gen, gamma)
