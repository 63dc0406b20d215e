"""`DecodeConfig`: a decoder's settings (everything that is not a session), checked once, when it is made.

The decoder makes one from its arguments before loading anything (a bad argument costs no session),
its `options=` mapping split by `split_options` (tuning fields here, session settings, strategy
options), then `resolved` fills in what needs the bundle (draft_probability "auto" -> the bundle's a*, a drafter
window clamped to the drafter's context). `SpeculativeDecoder.variant()` is `dataclasses.replace` of
it over the same sessions: the replaced config is checked by the same `__post_init__`.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass, field, fields, replace
from types import MappingProxyType
from typing import Mapping

import numpy as np

from edgespec.errors import GenerationError
from edgespec.runtime.samplers.answer_store import DEFAULT_STORE_MB, check_store_mb
from edgespec.runtime.api.checks import (DEFAULT_DRAFTER_WINDOW, DEFAULT_MAX_DRAFT_LENGTH, check_draft_length,
                                     check_drafter_window, check_plain_steps, check_strategy_options)
from edgespec.runtime.engine.sessions import check_threads
from edgespec.runtime.round.strategies import Strategy, get_strategy


# --prefill-graph's words for SpeculativeDecoder(prefill_graph=...)
PREFILL_GRAPH_SETTINGS = {"auto": "auto", "on": True, "off": False}


def check_flag(name: str, value) -> None:
    if not isinstance(value, (bool, np.bool_)):
        raise GenerationError(f"{name} must be True or False, got {value!r}")


DEFAULT_STRATEGY = "auto"          # chosen for the bundle and the machine (strategies.choose_auto)
DEFAULT_DRAFT_LENGTH = "auto"      # gamma chosen per round (runtime/round/governor.py)


@dataclass(frozen=True)
class DecodeConfig:
    strategy: Strategy
    draft_length: int | str = DEFAULT_DRAFT_LENGTH      # the setting: an int, or "auto" (runtime/round/governor.py)
    max_draft_length: int = DEFAULT_MAX_DRAFT_LENGTH     # gamma_max of draft_length="auto"
    draft_probability: float | str | None = None  # randomised drafting (randomised.py); "auto": the bundle's a*
    draft_confidence: float | None = None         # stop drafting when the drafter's top probability falls below
    concurrent_draft: bool = True                 # the no-draft position's forward beside the verify forward
    drafter_window: int | None = DEFAULT_DRAFTER_WINDOW   # drafter KV positions (context.DrafterWindow)
    plain_steps: str = "exact"                    # checks.check_plain_steps
    prefix_reuse: bool = True                     # prefix.py
    plain_guess: bool = True                      # a plain step may carry a lookup guess (rounds.plain_step)
    coupled_sampling: bool | str = "auto"         # COUPLED_SAMPLING_SETTINGS; samplers/coupled.py
    options: Mapping = field(default_factory=dict)        # strategy options (Strategy.options)

    def __post_init__(self):
        if isinstance(self.strategy, str):
            object.__setattr__(self, "strategy", get_strategy(self.strategy))
        check_draft_length(self.draft_length)
        check_draft_length(self.max_draft_length)
        check_plain_steps(self.plain_steps)
        check_drafter_window(self.drafter_window)
        check_flag("prefix_reuse", self.prefix_reuse)
        check_flag("plain_guess", self.plain_guess)
        check_flag("concurrent_draft", self.concurrent_draft)
        if not (self.coupled_sampling == "auto" or isinstance(self.coupled_sampling, (bool, np.bool_))):
            raise GenerationError(f"coupled_sampling must be 'auto', True or False, got {self.coupled_sampling!r}")
        c = self.draft_confidence
        if c is not None and (isinstance(c, bool) or not isinstance(c, (int, float)) or not 0.0 < c < 1.0):
            raise GenerationError(f"draft_confidence must be in (0, 1) or None, got {c!r}")
        a = self.draft_probability
        if a is not None:
            if a != "auto" and (isinstance(a, bool) or not isinstance(a, (int, float)) or not 0.0 < float(a) <= 1.0):
                raise GenerationError(f"draft_probability must be in (0, 1] or 'auto', got {a!r}")
            s = self.strategy
            if s.name != "auto" and not s.token_level:
                raise GenerationError(f"draft_probability needs a token-level drafting strategy (tli, sd, rdk-taylor, "
                                      f"rdk), not {s.name!r}")
        object.__setattr__(self, "options", MappingProxyType(check_strategy_options(dict(self.options))))

    @property
    def gamma(self) -> int:
        """Drafts per round at most: the fixed draft length, or gamma_max under "auto"; 0 for `ar`."""
        if not self.strategy.speculative:
            return 0
        return self.max_draft_length if self.draft_length == "auto" else int(self.draft_length)

    def couples(self, seed: int | None, greedy: bool) -> bool:
        """Whether a sampled generation with this seed samples coupled (samplers/coupled.py): "auto" where a
        seed is given (the seed then pins the tokens), True always (unseeded: a fresh seed), False never
        (rejection sampling, whose output depends on the drafts)."""
        if greedy:
            return False
        return seed is not None if self.coupled_sampling == "auto" else bool(self.coupled_sampling)

    @property
    def auto_length(self) -> bool:
        """A draft-length governor chooses gamma per round."""
        return self.draft_length == "auto" and self.strategy.speculative

    def resolved(self, bundle, drafter_max_position: int | None) -> "DecodeConfig":
        """This config on a bundle: a* for draft_probability "auto", the drafter window clamped to
        what the drafter's context holds with a full draft (said once, here)."""
        changes: dict = {}
        if self.draft_probability == "auto":
            if bundle.a_star is None:
                raise GenerationError("draft_probability='auto' needs a calibrated a* in the bundle "
                                      "(vocab/randomised.json)")
            changes["draft_probability"] = float(bundle.a_star)
        elif self.draft_probability is not None:
            changes["draft_probability"] = float(self.draft_probability)
        window = self.drafter_window
        if window is not None and drafter_max_position:
            room = max(2, drafter_max_position - self.max_draft_length - 2)
            if window > room:
                warnings.warn(f"drafter_window {window} exceeds the drafter's context ({drafter_max_position} "
                              f"positions, {self.max_draft_length} drafts): using {room}", stacklevel=4)
                changes["drafter_window"] = room
            else:
                changes["drafter_window"] = int(window)
        return replace(self, **changes) if changes else self


# SpeculativeDecoder(options=...): DecodeConfig's tuning fields, these session settings (their defaults),
# and the strategy options (Strategy.options); docs/runtime.md, "Options".
# answer_store_mb: the decoder's answer store (answer_store.py), shared by its variants; 0: off
SESSION_OPTIONS = {"draft_ep": None, "draft_threads": None, "defer_drafter": True,
                   "answer_store_mb": DEFAULT_STORE_MB, "cuda_graph": "auto"}
# "auto": the target's and the drafter's steps are captured as CUDA graphs on the CUDA EP (runtime/engine/kv_static.py);
# "static": their fixed buffers without capture, on any EP (the captured path's code, checked on a CPU);
# "off": neither.
CUDA_GRAPH_SETTINGS = ("auto", "static", "off")
TUNING_OPTIONS = tuple(f.name for f in fields(DecodeConfig)
                       if f.name not in ("strategy", "draft_length", "draft_probability", "options"))


def split_options(options: Mapping | None) -> tuple[dict, dict, dict]:
    """`options=` -> (DecodeConfig tuning fields, session settings over SESSION_OPTIONS' defaults,
    strategy options); an unknown name is an error naming the nearest known one."""
    if options is None:
        options = {}
    if not isinstance(options, Mapping):
        raise GenerationError(f"options must be a mapping of option names to values, got {type(options).__name__}")
    tuning = {k: v for k, v in options.items() if k in TUNING_OPTIONS}
    session = {k: options.get(k, default) for k, default in SESSION_OPTIONS.items()}
    rest = {k: v for k, v in options.items() if k not in TUNING_OPTIONS and k not in SESSION_OPTIONS}
    return tuning, session, check_strategy_options(rest, also=TUNING_OPTIONS + tuple(SESSION_OPTIONS))


def with_deprecated(options, keywords: dict, where: str = "SpeculativeDecoder"):
    """Keyword settings of earlier releases (now `options=` entries) merged under `options`, with one
    DeprecationWarning; they keep working for one release."""
    if not keywords or not isinstance(options, (Mapping, type(None))):
        return options                      # nothing deprecated, or options split_options refuses
    names = ", ".join(sorted(keywords))
    warnings.warn(f"{where}({names}=...) is deprecated and will be removed in the next release: pass "
                  f"options={{{', '.join(repr(k) + ': ...' for k in sorted(keywords))}}}", DeprecationWarning,
                  stacklevel=3)
    return {**keywords, **(options or {})}


def checked_config(bundle, config: DecodeConfig) -> DecodeConfig:
    """A decoder's or variant's config on `bundle`, resolved (DecodeConfig.resolved: a*, the drafter's
    context window) and its strategy's options checked: once, before anything is built for it."""
    config = config.resolved(bundle, bundle.drafter.max_position if bundle.has_drafter else None)
    if config.strategy.check:
        config.strategy.check(bundle, dict(config.options))
    return config


def check_decoder_settings(strategy=DEFAULT_STRATEGY, draft_length=DEFAULT_DRAFT_LENGTH, threads=None,
                           draft_probability=None, options=None, **_sessions) -> tuple[DecodeConfig, dict]:
    """SpeculativeDecoder's settings checked, nothing loaded: its DecodeConfig and its session settings
    (`options` split by split_options; the keywords that need sessions are checked when they are made)."""
    tuning, session, strategy_options = split_options(options)
    config = DecodeConfig(get_strategy(strategy), draft_length, draft_probability=draft_probability,
                          options=strategy_options, **tuning)
    check_threads(threads)
    check_threads(session["draft_threads"], "draft_threads")
    check_store_mb(session["answer_store_mb"])
    if session["cuda_graph"] not in CUDA_GRAPH_SETTINGS:
        raise GenerationError(f"options['cuda_graph'] must be one of {', '.join(CUDA_GRAPH_SETTINGS)}, got "
                              f"{session['cuda_graph']!r}")
    return config, session
