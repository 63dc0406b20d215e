"""The strategy registry: how each strategy drafts (`propose`, and for token-level ones the draft
distribution q over *target* ids) and how it accepts. The one decode round (rounds.py) calls them.

Built in (registered below, explicitly: no module registers itself on import):
- `ar`:  no drafter; the target alone through the same round (the speedup baseline).
- `tli`: Token-Level Intersection (tli.py; heterogeneous-vocabularies paper, Algorithm 4, line 4).
- `sd`:  vanilla speculative decoding (Algorithm 5) for same-tokenizer bundles. With one tokenizer
         every kept column has a target id, so q' = q and `sd` is literally the `tli` code path; it
         only refuses heterogeneous bundles.
- `rdk-taylor`, `rdk`: the RDK out-of-vocabulary samplers (rdk.py).
- `slem`: String-Level Exact Match (slem.py): a string-level proposal and exact-match acceptance.
- `ngram`, `ngram-tli`: prompt lookup (ngram.py), alone or with the drafter when no n-gram matches.
- `auto` (the default): resolved per call by `choose_auto` below.
Token-level strategies are lossless by construction: verify.py only needs the q the drafter really
sampled from. Randomised drafting (randomised.py) is a decoder option over any token-level strategy.

A strategy (`register(Strategy(...))` adds one):
- `prepare(bundle, options) -> state`: precompute once per decoder (masks, priors, CSR arrays).
- `distribution(state, kept_logits, params, out) -> out`: q over target ids, float64 [V_t], written
  into the caller's preallocated `out`.
- `greedy(state, kept_logits) -> target id`: the temperature-0 draft (default: argmax of q at T=1).
- `propose(gen, gamma) -> rounds.Draft` and `accept(gen, logits, draft) -> (n_acc, t)`: default the
  token-level `rounds.draft_tokens` / `rounds.accept_tokens`.
- `check(bundle, options)`: raise an EdgespecError when the bundle cannot serve the strategy.
- `options`: the names of the strategy options it reads (the decoder refuses names no strategy reads).
- `start(gen) -> state`: per-generation state (`gen.strategy_state`), when the strategy keeps any; the
  state's `begin_round(gen)` runs once a round that may draft, before the governor is consulted.
- `source(state) -> str`: which of its proposers this round uses (a pure function of the state), when
  it has several; each gets its own draft-length governor.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from edgespec.errors import GenerationError
from edgespec.runtime.round import ngram
from edgespec.runtime.samplers import rdk
from edgespec.runtime.round import slem
from edgespec.runtime.round import slrs
from edgespec.runtime.round.rounds import accept_tokens, draft_tokens
from edgespec.runtime.samplers.sampling import SamplingParams
from edgespec.runtime.samplers.tli import kept_columns, tli_distribution, tli_greedy


def _default_greedy(strategy: "Strategy") -> Callable:
    def greedy(state, kept_logits):
        out = np.empty(state.target_vocab, dtype=np.float64)
        return int(np.argmax(strategy.distribution(state, kept_logits, SamplingParams(temperature=1.0), out)))
    return greedy


def _require_same_tokenizer(bundle, options) -> None:
    if not bundle.same_tokenizer:
        raise GenerationError("strategy 'sd' needs a same-tokenizer bundle; this bundle's drafter has a "
                              "different tokenizer: use strategy 'tli' (or 'slem')")


@dataclass
class Strategy:
    name: str
    uses_drafter: bool = True                 # needs the bundle's drafter model
    speculative: bool = True                  # proposes drafts at all (`ar` does not)
    prepare: Callable[[Any, dict], Any] = kept_columns
    distribution: Callable | None = tli_distribution
    greedy: Callable | None = None
    check: Callable[[Any, dict], None] | None = None
    propose: Callable = draft_tokens
    accept: Callable = accept_tokens
    options: tuple[str, ...] = ()             # the strategy options `prepare`/`check` read
    start: Callable | None = None             # start(gen) -> per-generation state
    source: Callable | None = None            # source(state) -> this round's proposer

    @property
    def token_level(self) -> bool:
        """Drafts token by token from the drafter with the round's own proposer (rounds.draft_tokens), the
        rows randomised drafting and a grammar's per-token masks work on."""
        return self.uses_drafter and self.propose is draft_tokens

    def __post_init__(self):
        if self.greedy is None and self.distribution is not None:
            self.greedy = _default_greedy(self)


STRATEGIES: dict[str, Strategy] = {}


def register(strategy: Strategy) -> Strategy:
    """Add (or replace) a strategy in the registry; returns it."""
    STRATEGIES[strategy.name] = strategy
    return strategy


def for_bundle(strategy: Strategy, bundle) -> Strategy:
    """The strategy as `bundle` can run it: `auto` on a target-only bundle is `ngram` (the one speculation
    it can do); another strategy that needs a drafter is refused there, in one line."""
    if bundle.has_drafter or not strategy.uses_drafter:
        return strategy
    if strategy.name == "auto":
        return get_strategy("ngram")
    raise GenerationError(f"bundle {bundle.path} has no drafter: strategy {strategy.name!r} needs one; use "
                          "strategy 'ngram' (prompt lookup) or 'ar', or export a pair")


def get_strategy(name: str) -> Strategy:
    try:
        return STRATEGIES[name]
    except (KeyError, TypeError):
        raise GenerationError(f"unknown strategy {name!r}; choose one of {', '.join(sorted(STRATEGIES))}") from None


for _s in (
    # ar: target alone (autoregressive baseline)
    Strategy("ar", uses_drafter=False, speculative=False, prepare=lambda b, o: None, distribution=None, greedy=None),
    # auto: chosen per bundle, machine and sampling (choose_auto): ngram-tli on a shared tokenizer, slem on a
    # heterogeneous pair, tli when randomised, ngram or ar where the drafter does not pay
    Strategy("auto", prepare=lambda b, o: None, distribution=None, greedy=None, options=("ngram_max_n",)),
    # ngram: prompt lookup: the continuation of the latest earlier n-gram match (no drafter)
    Strategy("ngram", uses_drafter=False, prepare=lambda b, o: None, distribution=None, greedy=None, check=ngram.check,
             propose=ngram.propose, options=("ngram_max_n",), start=ngram.start),
    # ngram-tli: prompt lookup when the n-gram matches, the drafter's TLI draft otherwise
    Strategy("ngram-tli", greedy=tli_greedy, check=ngram.check, propose=ngram.propose, options=("ngram_max_n",),
             start=ngram.start, source=ngram.source),
    # tli: Token-Level Intersection (Algorithm 4)
    Strategy("tli", greedy=tli_greedy),
    # sd: vanilla speculative decoding, same tokenizer (Algorithm 5)
    Strategy("sd", greedy=tli_greedy, check=_require_same_tokenizer),
    # rdk-taylor: RDK first-order Taylor approximation (RDK paper, Eq. 3; option rdk_beta)
    Strategy("rdk-taylor", prepare=rdk.prepare_taylor, distribution=rdk.taylor_distribution, greedy=rdk.taylor_greedy,
             check=rdk.check_taylor, options=("rdk_beta",)),
    # rdk: exact RDK with the calibrated sparse affinity M (RDK paper, Algorithm 1; option rdk_tol)
    Strategy("rdk", prepare=rdk.prepare_rdk, distribution=rdk.rdk_strategy_distribution, greedy=rdk.rdk_greedy,
             check=rdk.check_rdk, options=("rdk_tol",)),
    # slem: String-Level Exact Match (heterogeneous-vocabularies paper, Algorithm 2; any temperature)
    Strategy("slem", prepare=slem.prepare, distribution=None, greedy=None, propose=slem.propose, accept=slem.accept,
             options=("slem_lookbehind", "slem_max_proposal")),
    # slrs1: SLRS with one drafter token of lookahead (heterogeneous-vocabularies paper, Algorithm 3)
    Strategy("slrs1", prepare=slrs.prepare, greedy=slrs.greedy, check=slrs.check),
):
    register(_s)


def choose_auto(bundle, greedy: bool, randomised: bool = False, drafter: bool = True, exact: bool = True,
                fast_plain: bool = False) -> str:
    """strategy="auto" (docs/samplers.md; measured: docs/results.md): on a heterogeneous pair SLEM, greedy or sampled
    (string-level matching drafts the tokens TLI's intersection cannot: 1.31-1.45x against TLI's
    0.96-1.15x on qwen-smollm and qwen-gemma); on a shared tokenizer TLI (= sd), whose rejection
    sampling accepts with probability sum min(p, q) where SLEM's exact match accepts d only with
    p(d), with prompt lookup in front (`ngram-tli`): a continuation of 2+ tokens found in the prompt or
    the output is drafted from there, the drafter drafts the rest. The drafter reads a bounded window
    (context.DrafterWindow), so copying from a long prompt (extraction, RAG, edits) is the lookup's job:
    on a 844-token extraction prompt a 128-256-token drafter window accepted 0.33-0.40 where the whole
    prompt gave 1.0 (benchmarks/window_sweep.py, calib split). Randomised drafting needs a token-level
    strategy: TLI.

    The device plan (runtime/planning/plan.py) may say the drafter does not pay on this machine (`drafter=False`:
    prompt lookup alone, `ngram`), that unpadded 1-token steps beat padded ones with lookup guesses
    (`fast_plain`: `ar`, run with plain_steps="fast"), or that no speculation is exact here (`exact=False`: `ar`)."""
    if not exact:
        return "ar"
    if not drafter and not randomised:
        return "ar" if fast_plain else "ngram"
    if randomised:
        return "tli"
    return "ngram-tli" if bundle.same_tokenizer else "slem"
