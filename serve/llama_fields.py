"""llama-server's request fields on the OpenAI routes: honoured where they mean something here,
otherwise accepted and reported (the response's `edgespec.not_applied` names each one and why), never
silently ignored and never a 400 for a client written against llama-server.

Honoured (`honour`): `n_predict` (max_tokens; -1 = as many as the server allows), top-level
`json_schema` and `grammar` (GBNF, converted to llguidance's Lark by llguidance's own converter),
`cache_prompt` (the prompt's KV is always reused where it can be: true is what happens; false is
reported, and the output is the same either way). Sampler fields at their neutral value change
nothing and are not reported; at any other value they are reported, because the runtime's sampler
(temperature, top_k, top_p, min_p, seed) does not apply them.
"""
from __future__ import annotations

import math

from edgespec.serve.errors import APIError

# field -> the values at which it changes nothing here (None = any value: it never changes the text)
NEUTRAL = {
    "repeat_penalty": (1, 1.0), "repeat_last_n": None, "penalty_last_n": None, "mirostat": (0,),
    "mirostat_tau": None, "mirostat_eta": None, "typical_p": (1, 1.0), "tfs_z": (1, 1.0),
    "top_n_sigma": (-1, -1.0, 0, 0.0), "xtc_probability": (0, 0.0), "xtc_threshold": None,
    "dynatemp_range": (0, 0.0), "dynatemp_exponent": None, "dry_multiplier": (0, 0.0), "dry_base": None,
    "dry_allowed_length": None, "dry_penalty_last_n": None, "dry_sequence_breakers": None, "min_keep": None,
    "samplers": None, "ignore_eos": (False,), "n_probs": (0,), "n_keep": None, "n_discard": None,
    "n_indent": (0,), "t_max_predict_ms": (0, -1), "t_max_prompt_ms": (0, -1), "id_slot": None, "slot_id": None,
    "return_tokens": (False,), "return_progress": (False,), "timings_per_token": (False,),
    "post_sampling_probs": (False,), "response_fields": None, "lora": (None, []), "n_cmpl": (1,),
    "chat_template_kwargs": (None, {}), "reasoning_format": None, "parse_tool_calls": None,
    "thinking_forced_open": (False,), "grammar_lazy": (False,), "grammar_triggers": (None, []),
    "preserved_tokens": None, "speculative.n_max": None, "speculative.n_min": None, "speculative.p_min": None,
}
WHY = {
    "ignore_eos": "generation always ends at the model's end token",
    "n_probs": "use logprobs/top_logprobs",
    "lora": "a bundle has no adapters",
    "chat_template_kwargs": "the bundle's chat template is rendered with its defaults",
    "t_max_predict_ms": "use max_tokens (the server's --timeout bounds every request)",
}
HONOURED = {"n_predict", "json_schema", "grammar", "cache_prompt"}
FIELDS = set(NEUTRAL) | HONOURED


def honour(body: dict) -> tuple[dict, dict]:
    """(what the honoured fields set on the request: max_tokens, constraint; not_applied: field -> why)."""
    out, not_applied = {}, {}
    if "n_predict" in body and body["n_predict"] is not None:
        n = body["n_predict"]
        if not isinstance(n, int) or isinstance(n, bool) or not (n >= 1 or n == -1):
            raise APIError(400, f"'n_predict' must be an integer >= 1, or -1 for no limit, got {n!r}"[:200],
                           param="n_predict")
        out["max_tokens"] = None if n == -1 else n
    schema, grammar = body.get("json_schema"), body.get("grammar")
    if schema is not None and grammar is not None:
        raise APIError(400, "give 'json_schema' or 'grammar', not both", param="grammar")
    if schema is not None:
        if not isinstance(schema, (dict, str)):
            raise APIError(400, "'json_schema' must be a JSON schema object", param="json_schema")
        out["constraint"] = {"json_schema": schema}
    if grammar is not None:
        out["constraint"] = {"grammar": gbnf_to_lark(grammar)}
    cache = body.get("cache_prompt")
    if cache is not None and not isinstance(cache, bool):
        raise APIError(400, f"'cache_prompt' must be a boolean, got {cache!r}"[:200], param="cache_prompt")
    if cache is False:
        not_applied["cache_prompt"] = "the prompt's KV is reused whenever it can be; the output is the same"
    for key, neutral in NEUTRAL.items():
        if key in body and body[key] is not None and neutral is not None and not _is_neutral(body[key], neutral):
            not_applied[key] = WHY.get(key, "not a sampler setting of this server (temperature, top_k, top_p, "
                                             "min_p and seed are)")
    return out, not_applied


def _is_neutral(value, neutral: tuple) -> bool:
    if isinstance(value, float) and not math.isfinite(value):
        return False
    return any(value == v and type(value) is not bool or value is v for v in neutral)


def gbnf_to_lark(text) -> str:
    """llama.cpp's GBNF grammar as llguidance's Lark (llguidance.gbnf_to_lark; Lark text passes as is)."""
    if not isinstance(text, str) or not text.strip():
        raise APIError(400, "'grammar' must be a GBNF grammar (a non-empty string)", param="grammar")
    try:
        from llguidance.gbnf_to_lark import any_to_lark  # lazy: the [serve] extra
        return any_to_lark(text)
    except Exception as exc:        # the converter raises plain exceptions of several kinds
        raise APIError(400, f"'grammar' is not a valid GBNF grammar: {' '.join(str(exc).split())[:200]}",
                       param="grammar") from None
