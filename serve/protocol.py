"""OpenAI request checking and response bodies (chat completions and completions), no HTTP here.

`parse_chat(body, ...)` / `parse_completion(body, ...)` turn a decoded JSON body into a `Request`, or
raise `APIError` (status, one-line message, the offending `param`) that the app sends in OpenAI's
error shape: {"error": {"message", "type", "param", "code"}}. Every field the runtime cannot honour
(n > 1, logprobs, legacy functions, penalties, ...) is refused by name, and so is any field this server
does not know: nothing is ignored silently. response_format, tools and tool messages: serve/tools.py.
"""
from __future__ import annotations

import math
import time
import uuid
from dataclasses import dataclass, field

from edgespec.serve import llama_fields, tools
from edgespec.serve.errors import APIError  # noqa: F401  (re-exported: protocol.APIError)

MAX_STOP = 4          # as OpenAI: up to 4 stop sequences
MAX_TOP_LOGPROBS = 20     # as OpenAI's chat route (the completions route allows 5; this server 20 on both)
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool"}

# Fields a client may send whose only honourable values are these (OpenAI's defaults).
_DEFAULT_ONLY = {
    "functions": (None, []),
    "function_call": (None, "none"), "presence_penalty": (None, 0, 0.0),
    "frequency_penalty": (None, 0, 0.0), "logit_bias": (None, {}), "store": (None, False),
    "modalities": (None, ["text"]), "audio": (None,), "prediction": (None,), "reasoning_effort": (None,),
    "web_search_options": (None,), "echo": (None, False), "best_of": (None, 1), "suffix": (None, ""),
    "service_tier": (None, "auto", "default"),
}
_COMMON = {"model", "max_tokens", "temperature", "top_p", "top_k", "min_p", "seed", "stop", "stream", "stream_options",
           "user", "metadata", "parse_special", "n"} | llama_fields.FIELDS
# structured output and tools: serve/tools.py
STRUCTURED_FIELDS = {"response_format", "tools", "tool_choice", "parallel_tool_calls"}
CHAT_FIELDS = _COMMON | {"messages", "max_completion_tokens", "logprobs", "top_logprobs"} | STRUCTURED_FIELDS | \
    (set(_DEFAULT_ONLY) - {"echo", "best_of", "suffix"})
COMPLETION_FIELDS = _COMMON | {"prompt", "n", "logprobs", "echo", "best_of", "suffix", "presence_penalty",
                               "frequency_penalty", "logit_bias"}


@dataclass
class Request:
    kind: str                         # "chat" | "completion"
    prompt: object                    # chat: list of {"role", "content"}; completion: str or list of ids
    max_tokens: int | None
    temperature: float = 1.0          # OpenAI's default
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stream: bool = False
    include_usage: bool = False
    response_format: dict | None = None   # a generate() constraint (serve/tools.py)
    tools: list = field(default_factory=list)
    tool_choice: str = "none"             # auto | none | required | a function's name
    parallel_tool_calls: bool = False     # only an explicit true allows more than one call
    parse_special: bool = False           # special-token text in messages read as control tokens (opt-in)
    n: int = 1                            # choices: n generations one after another
    logprobs: int | None = None           # None: none; k: each token's logprob and its k most likely
    batch: list | None = None             # completions: several prompts (str or ids), a choice each
    not_applied: dict = field(default_factory=dict)   # field -> why (the response's edgespec.not_applied)


def _bad(message: str, param: str, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code)


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v) -> bool:
    return (isinstance(v, (int, float)) and not isinstance(v, bool)) and math.isfinite(v)


def _check_fields(body: dict, allowed: set[str]) -> None:
    for key in body:
        if key not in allowed:
            raise _bad(f"Unrecognized request argument supplied: {key}", key, "unrecognized_argument")
    for key, ok in _DEFAULT_ONLY.items():
        if key in body and key in allowed and body[key] not in ok:
            raise _bad(f"'{key}' = {_short(body[key])} is not supported by this server (edgespec generates one "
                       f"plain-text choice); omit it", key, "unsupported_parameter")


def _short(v) -> str:
    s = repr(v)
    return s if len(s) <= 40 else s[:37] + "..."


def _common(body: dict, model: str, kind: str, prompt, strict_model: bool = False) -> Request:
    m = body.get("model")
    if m is not None and not isinstance(m, str):
        raise _bad(f"'model' must be a string, got {type(m).__name__}", "model")
    if strict_model and m is None:          # else any name, or none, is the served bundle (llama-server, Ollama)
        raise _bad("you must provide a model parameter", "model")
    if strict_model and m != model:
        raise APIError(404, f"The model '{_short(m)[1:-1]}' does not exist; this server serves '{model}'",
                       param="model", code="model_not_found")
    honoured, not_applied = llama_fields.honour(body)
    req = Request(kind=kind, prompt=prompt, max_tokens=_max_tokens(body, kind), not_applied=not_applied,
                  response_format=honoured.get("constraint"))
    if "max_tokens" in honoured and req.max_tokens is None:
        req.max_tokens = honoured["max_tokens"]
    special = body.get("parse_special")
    if special is not None and not isinstance(special, bool):
        raise _bad(f"'parse_special' must be a boolean, got {_short(special)}", "parse_special")
    req.parse_special = bool(special)
    n = body.get("n")
    if n is not None:
        if not _is_int(n) or n < 1:
            raise _bad(f"'n' must be an integer >= 1, got {_short(n)}", "n")
        req.n = n
    t = body.get("temperature")
    if t is not None:
        if not _is_number(t) or not 0.0 <= t <= 2.0:
            raise _bad(f"'temperature' must be a number in [0, 2], got {_short(t)}", "temperature")
        req.temperature = float(t)
    p = body.get("top_p")
    if p is not None:
        if not _is_number(p) or not 0.0 < p <= 1.0:
            raise _bad(f"'top_p' must be a number in (0, 1], got {_short(p)}", "top_p")
        req.top_p = float(p) if p < 1.0 else None
    k = body.get("top_k")          # an extension (vLLM and llama.cpp take it too)
    if k is not None:
        if not _is_int(k) or k < 0:
            raise _bad(f"'top_k' must be an integer >= 0, got {_short(k)}", "top_k")
        req.top_k = k or None
    m = body.get("min_p")          # an extension (vLLM and llama.cpp take it too)
    if m is not None:
        if not _is_number(m) or not 0.0 <= m <= 1.0:
            raise _bad(f"'min_p' must be a number in [0, 1], got {_short(m)}", "min_p")
        req.min_p = float(m) or None
    s = body.get("seed")
    if s is not None:
        if not _is_int(s) or not 0 <= s < 2 ** 63:
            raise _bad(f"'seed' must be an integer >= 0, got {_short(s)}", "seed")
        req.seed = s
    req.stop = _stop(body.get("stop"))
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise _bad(f"'stream' must be a boolean, got {_short(stream)}", "stream")
    req.stream = bool(stream)
    so = body.get("stream_options")
    if so is not None:
        if not req.stream:
            raise _bad("'stream_options' is only allowed when 'stream' is true", "stream_options")
        if not isinstance(so, dict) or set(so) - {"include_usage"} or not isinstance(so.get("include_usage", False), bool):
            raise _bad("'stream_options' must be an object {\"include_usage\": bool}", "stream_options")
        req.include_usage = bool(so.get("include_usage"))
    user = body.get("user")
    if user is not None and not isinstance(user, str):
        raise _bad(f"'user' must be a string, got {type(user).__name__}", "user")
    meta = body.get("metadata")
    if meta is not None and not isinstance(meta, dict):
        raise _bad(f"'metadata' must be an object, got {type(meta).__name__}", "metadata")
    return req


def _max_tokens(body: dict, kind: str) -> int | None:
    names = [n for n in ("max_completion_tokens", "max_tokens") if body.get(n) is not None]
    if kind == "completion":
        names = [n for n in names if n == "max_tokens"]
    if len(names) == 2 and body["max_tokens"] != body["max_completion_tokens"]:
        raise _bad("give 'max_completion_tokens' or 'max_tokens', not both with different values", "max_tokens")
    if not names:
        return None
    v = body[names[0]]
    if not _is_int(v) or v < 1:
        raise _bad(f"'{names[0]}' must be an integer >= 1, got {_short(v)}", names[0])
    return v


def _stop(stop) -> list[str]:
    if stop is None:
        return []
    items = [stop] if isinstance(stop, str) else stop
    if not isinstance(items, list) or not all(isinstance(s, str) for s in items):
        raise _bad(f"'stop' must be a string or a list of strings, got {_short(stop)}", "stop")
    if len(items) > MAX_STOP:
        raise _bad(f"'stop' takes at most {MAX_STOP} sequences, got {len(items)}", "stop")
    if any(not s for s in items):
        raise _bad("'stop' sequences must be non-empty strings", "stop")
    return list(items)


def _opening(body, allowed: set[str], key: str):
    """The checks both routes open with: a JSON object, only known fields, and its required `key`
    (messages or prompt) present. Returns body[key]."""
    if not isinstance(body, dict):
        raise _bad(f"the request body must be a JSON object, got {type(body).__name__}", None)
    _check_fields(body, allowed)
    value = body.get(key)
    if value is None:
        raise _bad(f"'{key}' is a required property", key)
    return value


def parse_chat(body, model: str, strict_model: bool = False) -> Request:
    msgs = _opening(body, CHAT_FIELDS, "messages")
    if not isinstance(msgs, list):
        raise _bad(f"'messages' must be an array of message objects, got {type(msgs).__name__}", "messages")
    if not msgs:
        raise _bad("'messages' must not be empty", "messages")
    messages = [_message(m, i) for i, m in enumerate(msgs)]
    tools.check_history(messages)
    req = _common(body, model, "chat", messages, strict_model)
    asked = tools.check_response_format(body.get("response_format"))
    if asked and req.response_format:
        raise _bad("give 'response_format' or llama.cpp's 'json_schema'/'grammar', not both", "response_format")
    req.response_format = asked or req.response_format
    req.tools = tools.check_tools(body.get("tools"))
    req.tool_choice = tools.check_tool_choice(body.get("tool_choice"), req.tools)
    parallel = body.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        raise _bad(f"'parallel_tool_calls' must be a boolean, got {_short(parallel)}", "parallel_tool_calls")
    req.parallel_tool_calls = parallel is True      # unset: one call (llama-server's default; serve/tools.py)
    lp, top = body.get("logprobs"), body.get("top_logprobs")
    if lp is not None and not isinstance(lp, bool):
        raise _bad(f"'logprobs' must be a boolean, got {_short(lp)}", "logprobs")
    if top is not None and (not _is_int(top) or not 0 <= top <= MAX_TOP_LOGPROBS):
        raise _bad(f"'top_logprobs' must be an integer in [0, {MAX_TOP_LOGPROBS}], got {_short(top)}", "top_logprobs")
    if top and not lp:
        raise _bad("'top_logprobs' needs 'logprobs': true", "top_logprobs")
    req.logprobs = (top or 0) if lp else None
    return req


def _message(m, i: int) -> dict:
    where = f"messages[{i}]"
    if not isinstance(m, dict):
        raise _bad(f"'{where}' must be an object with 'role' and 'content', got {type(m).__name__}", where)
    role = m.get("role")
    if not isinstance(role, str) or role not in ROLES:
        raise _bad(f"'{where}.role' must be one of {', '.join(ROLES)}, got {_short(role)}", f"{where}.role")
    extra = tools.check_message(m, where)         # tool_call_id, tool_calls, name
    content = m.get("content")
    if content is None and extra.get("tool_calls"):
        content = ""
    if isinstance(content, list):          # content parts: only text ones
        texts = []
        for j, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise _bad(f"'{where}.content[{j}]' must be a text part {{\"type\": \"text\", \"text\": ...}} "
                           "(this server takes text only)", f"{where}.content")
            texts.append(part["text"])
        content = "".join(texts)
    if not isinstance(content, str):
        raise _bad(f"'{where}.content' must be a string or a list of text parts, got {_short(content)}",
                   f"{where}.content")
    return dict(extra, role=ROLES[role], content=content)


def _one_prompt(p, where: str):
    if isinstance(p, list):
        if not p or not all(_is_int(t) and t >= 0 for t in p):
            raise _bad(f"'{where}' must be a string, a list of token ids, or a list of those", "prompt")
    elif not isinstance(p, str):
        raise _bad(f"'{where}' must be a string or a list of token ids, got {type(p).__name__}", "prompt")
    if not p:
        raise _bad(f"'{where}' must not be empty", "prompt")
    return p


def parse_completion(body, model: str, strict_model: bool = False) -> Request:
    p = _opening(body, COMPLETION_FIELDS, "prompt")
    batch = None
    if isinstance(p, list) and p and all(isinstance(x, (str, list)) for x in p):
        batch = [_one_prompt(x, f"prompt[{i}]") for i, x in enumerate(p)]       # a batch: a choice per prompt
        p = batch[0]
        batch = batch if len(batch) > 1 else None
    else:
        p = _one_prompt(p, "prompt")
    req = _common(body, model, "completion", p, strict_model)
    req.batch = batch
    if req.parse_special:
        raise _bad("'parse_special' is for chat messages: a completion prompt is read as written", "parse_special")
    lp = body.get("logprobs")                 # the completions route's form: the number of alternatives
    if lp is not None and (not _is_int(lp) or not 0 <= lp <= MAX_TOP_LOGPROBS):
        raise _bad(f"'logprobs' must be an integer in [0, {MAX_TOP_LOGPROBS}] (alternatives per token), got "
                   f"{_short(lp)}", "logprobs")
    req.logprobs = lp
    return req


# ---------------------------------------------------------------------------------- responses
def new_id(kind: str) -> str:
    return ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex[:24]


def finish_reason(stop_reason: str) -> str:
    return "stop" if stop_reason in ("eos", "stop") else "length"


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def choice_body(req: Request, index: int, text: str, reason: str, logprobs: dict | None = None) -> dict:
    if req.kind == "chat":
        return {"index": index, "message": {"role": "assistant", "content": text, "refusal": None},
                "logprobs": logprobs, "finish_reason": reason}
    return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": reason}


def full_body(req: Request, rid: str, model: str, choices: list[dict], use: dict, ext: dict) -> dict:
    obj = "chat.completion" if req.kind == "chat" else "text_completion"
    return {"id": rid, "object": obj, "created": int(time.time()), "model": model, "choices": choices,
            "usage": use, "system_fingerprint": None, "edgespec": ext}


def chunk_body(req: Request, rid: str, model: str, created: int, text: str | None, reason: str | None = None,
               first: bool = False, index: int = 0, logprobs: dict | None = None) -> dict:
    if req.kind == "chat":
        delta = {"role": "assistant", "content": ""} if first else ({"content": text} if text is not None else {})
        choice = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": reason}
        obj = "chat.completion.chunk"
    else:
        choice = {"index": index, "text": text or "", "logprobs": logprobs, "finish_reason": reason}
        obj = "text_completion"
    return {"id": rid, "object": obj, "created": created, "model": model, "choices": [choice],
            "system_fingerprint": None}
