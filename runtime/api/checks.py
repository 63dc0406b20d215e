"""Every decoder and per-call argument, checked before anything loads or runs (the CLI, the bench and
the server call these too): one-line GenerationError on bad input."""
from __future__ import annotations

import difflib

import numpy as np

from edgespec.errors import GenerationError
from edgespec.runtime.planning.plan import MAX_GAMMA
from edgespec.runtime.samplers.sampling import SamplingParams
from edgespec.runtime.round.strategies import STRATEGIES

# Drafter context window (context.DrafterWindow): acceptance against window size, benchmarks/window_sweep.py.
DEFAULT_DRAFTER_WINDOW = 256
PLAIN_STEPS = ("exact", "fast")


def check_plain_steps(value) -> str:
    """"exact": a 1-token target step is padded to the graph's min_forward_tokens, so it computes the
    function a verify forward computes (greedy output = speculative output); "fast": the 1-token kernel
    path, as onnxruntime-genai runs it (20-25% faster on int4 builder graphs; its greedy output may
    differ from the padded one where two logits nearly tie)."""
    if value not in PLAIN_STEPS:
        raise GenerationError(f"plain_steps must be 'exact' or 'fast', got {value!r}")
    return value


def check_drafter_window(value) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 2:
        raise GenerationError(f"drafter_window must be an integer >= 2 (drafter context positions) or None "
                              f"(the whole text), got {value!r}")


MAX_DRAFT_LENGTH = 64       # more drafts per verify only waste forwards (acceptance decays geometrically)
DEFAULT_MAX_DRAFT_LENGTH = MAX_GAMMA    # gamma_max of draft_length="auto": the plan's widest (DecodeConfig, bench)
DEFAULT_MAX_NEW_TOKENS = 128    # generate/stream, `edgespec generate` and bench read this one


def check_draft_length(k) -> None:
    if k == "auto":
        return
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 1 <= k <= MAX_DRAFT_LENGTH:
        raise GenerationError(f"draft_length must be an integer in [1, {MAX_DRAFT_LENGTH}] or 'auto', got {k!r}")


def check_strategy_options(options: dict, also: tuple = ()) -> dict:
    """Strategy options must be ones some strategy reads (a misspelt name is an error, not a no-op);
    `also`: other option names the caller takes (named in the hint)."""
    known = {name for s in STRATEGIES.values() for name in s.options}
    for key in options:
        if key not in known:
            near = difflib.get_close_matches(key, sorted(known | set(also)), n=1)
            hint = f"; did you mean {near[0]!r}?" if near else f"; known: {', '.join(sorted(known | set(also)))}"
            raise GenerationError(f"unknown option {key!r}{hint}")
    return dict(options)


def check_generation_args(max_new_tokens, temperature, top_k, top_p, seed, stop,
                          min_p=None) -> tuple[SamplingParams, list[str]]:
    """Every per-call argument, checked before anything runs (the CLI calls this before loading sessions)."""
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, (int, np.integer)) or max_new_tokens < 1:
        raise GenerationError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")
    for name, value in (("temperature", temperature), ("top_p", top_p), ("min_p", min_p)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float, np.number))):
            raise GenerationError(f"{name} must be a number, got {value!r}")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, (int, np.integer))):
        raise GenerationError(f"top_k must be an integer >= 1 or None, got {top_k!r}")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0):
        raise GenerationError(f"seed must be an integer >= 0 or None, got {seed!r}")
    params = SamplingParams(temperature=float(temperature) if temperature is not None else temperature,
                            top_k=top_k, top_p=top_p, min_p=None if min_p is None else float(min_p))
    return params, _stop_strings(stop)


def _stop_strings(stop) -> list[str]:
    if stop is None:
        return []
    if not isinstance(stop, (str, list, tuple)):      # an int, a dict, a bare iterator: not a stop list
        raise GenerationError(f"stop must be a non-empty string or a list of non-empty strings, got {stop!r}")
    items = [stop] if isinstance(stop, str) else list(stop)
    if not all(isinstance(s, str) and s for s in items):
        raise GenerationError("stop must be a non-empty string or a list of non-empty strings")
    return items
