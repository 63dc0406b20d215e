"""POST /v1/responses (OpenAI's Responses API) as the chat route's request, no HTTP here.

`parse_responses(body, model, memory)` turns a Responses body into the `protocol.Request` the chat route
runs (kind "chat"): it builds a chat-completions body and checks it with `protocol.parse_chat`, so both
routes take sampling, tools, tool_choice and structured output the same way. An error found there names
the field the client sent, not the chat one (messages[3].tool_call_id -> input[2].call_id;
`ResponseContext.renamed` does the same for errors raised later, e.g. compiling the constraint).

- `input`: a string (one user message) or a list of items: messages (roles user, system, developer,
  assistant; content a string or input_text/output_text parts), `function_call` items (consecutive ones,
  and the assistant text right before them, are ONE assistant turn with several tool_calls: how the
  model wrote them) and `function_call_output` items (tool results). Anything else (images, files,
  item references, reasoning, built-in tools' items) is refused by name: this server runs text and
  function tools only.
- `instructions`: a system message first, for this response only (as OpenAI, it is not carried over
  through `previous_response_id`).
- `previous_response_id`: the conversation of that response (its input and its output), kept by
  `ResponseMemory` when it was created with `store` (default true), is prepended; an unknown or evicted
  id is a 404 `previous_response_not_found`.
- Fields the runtime cannot honour are refused by name, or, where OpenAI clients send them with no
  effect on the text here (`reasoning`, `truncation: "auto"`, `text.verbosity`), accepted and reported
  in the response's `edgespec.not_applied`. Unknown fields: 400 `unrecognized_argument`, as on chat.

The output side (the Response object, its streaming events, SSE): serve/response_events.py; the route:
serve/responses_route.py.
"""
from __future__ import annotations

import json
import re
import threading
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field

from edgespec.serve import protocol
from edgespec.serve.errors import APIError

# Fields a client may send whose only honourable values are these (OpenAI's defaults).
_DEFAULT_ONLY = {"background": (None, False), "service_tier": (None, "auto", "default"), "top_logprobs": (None, 0),
                 "max_tool_calls": (None,)}
FIELDS = {"model", "input", "instructions", "previous_response_id", "tools", "tool_choice", "parallel_tool_calls",
          "text", "max_output_tokens", "temperature", "top_p", "top_k", "min_p", "seed", "stream", "stream_options",
          "store", "metadata", "user", "truncation", "include", "reasoning", "parse_special", "safety_identifier",
          "prompt_cache_key"} | set(_DEFAULT_ONLY)
# passed to the chat body as they are (parse_chat checks them)
_PASSED = ("temperature", "top_p", "top_k", "min_p", "seed", "stream", "user", "parse_special", "parallel_tool_calls",
           "metadata")
ROLES = ("user", "system", "developer", "assistant")
ITEMS = ("message", "function_call", "function_call_output")
_TEXT_PARTS = ("input_text", "output_text")
_NAMES = {"response_format": "text.format", "response_format.json_schema.name": "text.format.name",
          "response_format.json_schema.schema": "text.format.schema", "response_format.json_schema": "text.format",
          "response_format.schema": "text.format.schema", "response_format.type": "text.format.type",
          "max_tokens": "max_output_tokens", "tool_choice.function.name": "tool_choice.name", "messages": "input"}
_SUFFIXES = {".tool_call_id": ".call_id", ".function.arguments": ".arguments", ".function.name": ".name",
             ".id": ".call_id", "": ""}


def _bad(message: str, param: str | None, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code)


def _short(v) -> str:
    s = repr(v)
    return s if len(s) <= 40 else s[:37] + "..."


@dataclass
class ResponseContext:
    """What the output of one response needs: its id, the parameters its Response object echoes
    (`echo`: instructions, tools as given, tool_choice, temperature, top_p, max_output_tokens, text,
    parallel_tool_calls, previous_response_id, metadata, store, truncation, user), and the conversation
    (`messages`, chat format, without the instructions) that `ResponseMemory` keeps for a follow-up."""
    id: str
    created_at: int
    messages: list[dict]
    store: bool = True
    echo: dict = field(default_factory=dict)
    origins: list[dict] = field(default_factory=list)   # per chat message: the Responses field it came from

    @property
    def hex(self) -> str:
        return self.id[len("resp_"):]

    def renamed(self, exc: APIError) -> APIError:
        """`exc` (raised about the chat body) naming the Responses field instead: its param and message."""
        old = exc.param or ""
        new = _NAMES.get(old)
        m = re.fullmatch(r"messages\[(\d+)\](?:\.tool_calls\[(\d+)\])?(.*)", old)
        if m and int(m[1]) < len(self.origins):
            o = self.origins[int(m[1])]
            calls, rest = o.get("calls", []), m[3]
            if m[2] is not None and int(m[2]) < len(calls):
                at = calls[int(m[2])]
            elif m[2] is not None:
                at, rest = o["at"], ""
            else:
                at = o["at"]
            rest = ".output" if o.get("tool") and rest == ".content" else _SUFFIXES.get(rest, rest)
            new = at if at in ("instructions", "previous_response_id") else at + rest
        elif new is None:
            t = re.fullmatch(r"(tools\[\d+\])\.function(\..*)?", old)
            new = t[1] + (t[2] or "") if t else old
        if not old or new == old:
            return exc
        return APIError(exc.status, exc.message.replace(old, new), param=new, code=exc.code, type_=exc.type,
                        headers=exc.headers)


def parse_responses(body, model: str, memory: "ResponseMemory") -> tuple[protocol.Request, ResponseContext]:
    """(the chat Request to run, the context of its Response) for a decoded Responses body, or APIError.
    `model` is the served model's name; whether the body's `model` must name it is the caller's check."""
    if not isinstance(body, dict):
        raise _bad(f"the request body must be a JSON object, got {type(body).__name__}", None)
    for key in body:
        if key not in FIELDS:
            raise _bad(f"Unrecognized request argument supplied: {key}", key, "unrecognized_argument")
    for key, ok in _DEFAULT_ONLY.items():
        if body.get(key) not in ok:
            raise _bad(f"'{key}' = {_short(body[key])} is not supported by this server; omit it", key,
                       "unsupported_parameter")
    for key in ("model", "instructions", "previous_response_id", "user", "safety_identifier", "prompt_cache_key"):
        if body.get(key) is not None and not isinstance(body[key], str):
            raise _bad(f"'{key}' must be a string, got {type(body[key]).__name__}", key)
    for key in ("store", "stream"):
        if body.get(key) is not None and not isinstance(body[key], bool):
            raise _bad(f"'{key}' must be a boolean, got {_short(body[key])}", key)
    not_applied: dict = {}
    prev = body.get("previous_response_id")
    history = []
    if prev is not None:
        history = memory.get(prev)
        if history is None:
            raise APIError(404, f"Previous response with id '{prev[:64]}' not found (this server keeps the last "
                           f"{memory.max_entries} stored responses, in memory).", param="previous_response_id",
                           code="previous_response_not_found")
    if body.get("input") is None:
        raise _bad("'input' is a required property", "input")
    new, new_origins = _items(body["input"])
    instructions = body.get("instructions")
    head = [{"role": "system", "content": instructions}] if instructions else []
    origins = [{"at": "instructions"}] * len(head) + [{"at": "previous_response_id"}] * len(history) + new_origins
    chat = {"model": model, "messages": head + history + new}
    chat.update({k: body[k] for k in _PASSED if body.get(k) is not None})
    if body.get("max_output_tokens") is not None:
        chat["max_tokens"] = body["max_output_tokens"]
    _metadata(body.get("metadata"))
    chat["response_format"], text_echo = _text(body.get("text"), not_applied)
    chat["tools"], tools_echo = _tools(body.get("tools"))
    chat["tool_choice"] = _tool_choice(body.get("tool_choice"))
    _stream_options(body.get("stream_options"), body.get("stream"), not_applied)
    truncation = _extras(body, not_applied)
    ctx = ResponseContext(id="resp_" + uuid.uuid4().hex, created_at=int(time.time()), messages=history + new,
                          store=body.get("store") is not False, origins=origins)
    try:
        req = protocol.parse_chat({k: v for k, v in chat.items() if v is not None}, model)
    except APIError as exc:
        raise ctx.renamed(exc) from None
    req.not_applied.update(not_applied)
    choice = req.tool_choice if req.tool_choice in ("auto", "none", "required") else \
        {"type": "function", "name": req.tool_choice}
    ctx.echo = {"instructions": instructions, "max_output_tokens": req.max_tokens, "store": ctx.store,
                "metadata": body.get("metadata") or {}, "parallel_tool_calls": req.parallel_tool_calls,
                "previous_response_id": prev, "temperature": req.temperature, "text": text_echo, "tool_choice": choice,
                "tools": tools_echo, "top_p": req.top_p if req.top_p is not None else 1.0, "truncation": truncation,
                "user": body.get("user"), "reasoning": None}
    return req, ctx


def _keys(obj: dict, allowed: set[str], at: str) -> None:
    """Refuse a key this server does not take (null ones pass: clients echo output items back)."""
    for key in obj:
        if key not in allowed and obj[key] is not None:
            raise _bad(f"'{at}.{key}' is not supported by this server", f"{at}.{key}", "unsupported_parameter")


def _string(obj: dict, key: str, at: str) -> str:
    if not isinstance(obj.get(key), str) or (key != "arguments" and not obj[key]):
        raise _bad(f"'{at}.{key}' is required (a {'' if key == 'arguments' else 'non-empty '}string)", f"{at}.{key}")
    return obj[key]


def _items(inp) -> tuple[list[dict], list[dict]]:
    """(chat messages, their origins) of `input`."""
    if isinstance(inp, str):
        return [{"role": "user", "content": inp}], [{"at": "input"}]
    if not isinstance(inp, list) or not inp:
        raise _bad("'input' must be a string or a non-empty array of input items", "input")
    msgs: list[dict] = []
    origins: list[dict] = []
    for j, it in enumerate(inp):
        at = f"input[{j}]"
        if not isinstance(it, dict):
            raise _bad(f"'{at}' must be an object (an input item), got {type(it).__name__}", at)
        kind = it.get("type", "message")
        if kind == "message":
            _keys(it, {"type", "role", "content", "id", "status", "phase"}, at)
            if it.get("role") not in ROLES:
                raise _bad(f"'{at}.role' must be one of {', '.join(ROLES)}, got {_short(it.get('role'))}", f"{at}.role")
            msgs.append({"role": it["role"], "content": _content(it.get("content"), f"{at}.content")})
            origins.append({"at": at})
        elif kind == "function_call":
            _keys(it, {"type", "call_id", "name", "arguments", "id", "status"}, at)
            call = {"id": _string(it, "call_id", at), "type": "function",
                    "function": {"name": _string(it, "name", at), "arguments": _string(it, "arguments", at)}}
            if msgs and msgs[-1]["role"] == "assistant":     # the same assistant turn
                msgs[-1].setdefault("tool_calls", []).append(call)
                origins[-1].setdefault("calls", []).append(at)
            else:
                msgs.append({"role": "assistant", "content": "", "tool_calls": [call]})
                origins.append({"at": at, "calls": [at]})
        elif kind == "function_call_output":
            _keys(it, {"type", "call_id", "output", "id", "status"}, at)
            msgs.append({"role": "tool", "tool_call_id": _string(it, "call_id", at),
                         "content": _content(it.get("output"), f"{at}.output")})
            origins.append({"at": at, "tool": True})
        else:
            raise _bad(f"'{at}' has type {_short(kind)}: this server takes {', '.join(ITEMS)} items only "
                       "(text and function tools)", f"{at}.type", "unsupported_value")
    return msgs, origins


def _content(content, at: str) -> str:
    """The text of a message's content: a string, or input_text/output_text parts joined."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise _bad(f"'{at}' must be a string or an array of input_text parts, got {_short(content)}", at)
    texts = []
    for m, part in enumerate(content):
        where = f"{at}[{m}]"
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in _TEXT_PARTS:
            raise _bad(f"'{where}' has type {_short(kind)}: this server takes text only (input_text, output_text)",
                       where, "unsupported_value")
        _keys(part, {"type", "text", "annotations", "logprobs"}, where)
        if not isinstance(part.get("text"), str):
            raise _bad(f"'{where}.text' is required (a string)", f"{where}.text")
        texts.append(part["text"])
    return "".join(texts)


def _tools(tools) -> tuple[list | None, list]:
    """(the chat route's tools, the tools the Response echoes) of Responses function tools."""
    if tools is None:
        return None, []
    if not isinstance(tools, list):
        raise _bad("'tools' must be an array of function tools", "tools")
    chat, echo = [], []
    for i, t in enumerate(tools):
        at = f"tools[{i}]"
        if not isinstance(t, dict):
            raise _bad(f"'{at}' must be a function tool object", at)
        if t.get("type") != "function":
            raise _bad(f"'{at}.type' {_short(t.get('type'))} is not supported by this server: only function tools "
                       "(type 'function') are", f"{at}.type", "unsupported_value")
        _keys(t, {"type", "name", "description", "parameters", "strict"}, at)
        if t.get("strict") is not None and not isinstance(t["strict"], bool):
            raise _bad(f"'{at}.strict' must be a boolean", f"{at}.strict")
        chat.append({"type": "function", "function": {k: t[k] for k in ("name", "description", "parameters")
                                                      if t.get(k) is not None}})
        echo.append({"type": "function", "name": t.get("name"), "description": t.get("description"),
                     "parameters": t.get("parameters") or {"type": "object", "properties": {}},
                     "strict": t.get("strict") is not False})   # the grammar always follows the schema
    return chat, echo


def _tool_choice(choice):
    if isinstance(choice, dict):
        if choice.get("type") != "function":
            raise _bad(f"'tool_choice' of type {_short(choice.get('type'))} is not supported by this server: give "
                       "'auto', 'none', 'required' or {\"type\": \"function\", \"name\": ...}", "tool_choice",
                       "unsupported_value")
        _keys(choice, {"type", "name"}, "tool_choice")
        return {"type": "function", "function": {"name": choice.get("name")}}
    return choice


def _text(text, not_applied: dict) -> tuple[dict | None, dict]:
    """(the chat route's response_format, the `text` the Response echoes) of `text.format`."""
    if text is None:
        return None, {"format": {"type": "text"}}
    if not isinstance(text, dict):
        raise _bad("'text' must be an object {\"format\": ...}", "text")
    _keys(text, {"format", "verbosity"}, "text")
    if text.get("verbosity") is not None:
        not_applied["text.verbosity"] = "the answer's length is not steered here; use max_output_tokens"
    f = text.get("format")
    if f is None:
        return None, {"format": {"type": "text"}}
    if not isinstance(f, dict) or f.get("type") not in ("text", "json_object", "json_schema"):
        raise _bad("'text.format.type' must be 'text', 'json_object' or 'json_schema'", "text.format.type")
    if f["type"] != "json_schema":
        _keys(f, {"type"}, "text.format")
        return ({"type": "json_object"} if f["type"] == "json_object" else None), {"format": {"type": f["type"]}}
    _keys(f, {"type", "name", "schema", "strict", "description"}, "text.format")
    name = _string(f, "name", "text.format")
    if not isinstance(f.get("schema"), dict):
        raise _bad("'text.format.schema' is required (a JSON schema object)", "text.format.schema")
    echo = {"type": "json_schema", "name": name, "schema": f["schema"], "strict": f.get("strict"),
            "description": f.get("description")}
    return {"type": "json_schema", "json_schema": {"name": name, "schema": f["schema"]}}, {"format": echo}


def _metadata(meta) -> None:
    """As OpenAI: at most 16 string pairs (keys up to 64 characters, values up to 512)."""
    if meta is None:
        return
    if not isinstance(meta, dict) or len(meta) > 16 or not all(
            isinstance(k, str) and len(k) <= 64 and isinstance(v, str) and len(v) <= 512 for k, v in meta.items()):
        raise _bad("'metadata' must be an object of at most 16 string values (keys up to 64 characters, values "
                   "up to 512)", "metadata")


def _stream_options(so, stream, not_applied: dict) -> None:
    if so is None:
        return
    if stream is not True:
        raise _bad("'stream_options' is only allowed when 'stream' is true", "stream_options")
    if not isinstance(so, dict) or set(so) - {"include_obfuscation"} or \
            not isinstance(so.get("include_obfuscation", False), bool):
        raise _bad("'stream_options' must be an object {\"include_obfuscation\": bool}", "stream_options")
    if so.get("include_obfuscation"):
        not_applied["stream_options.include_obfuscation"] = "stream events carry no obfuscation padding"


def _extras(body: dict, not_applied: dict) -> str:
    """Check include, reasoning and truncation; returns the truncation the Response echoes."""
    inc = body.get("include")
    if inc is not None and not isinstance(inc, list):
        raise _bad("'include' must be an array", "include")
    if inc:
        raise _bad(f"'include' value {_short(inc[0])} is not supported by this server (it produces text and "
                   "function calls only)", "include", "unsupported_value")
    r = body.get("reasoning")
    if r is not None and not isinstance(r, dict):
        raise _bad("'reasoning' must be an object {\"effort\": ...}", "reasoning")
    if r and any(v is not None for v in r.values()):
        not_applied["reasoning"] = "the model answers directly: this server runs no reasoning step"
    t = body.get("truncation")
    if t not in (None, "disabled", "auto"):
        raise _bad(f"'truncation' must be 'disabled' or 'auto', got {_short(t)}", "truncation")
    if t == "auto":
        not_applied["truncation"] = ("the conversation is never cut: one longer than the model's context is "
                                     "refused (context_length_exceeded)")
    return t or "disabled"


class ResponseMemory:
    """Stored responses for `previous_response_id`: response id -> its conversation (chat messages in
    the shape `protocol.parse_chat` takes: the messages in, then the assistant's output, tool_calls with
    JSON-text arguments). An LRU bounded in entries and in total characters (each entry holds its whole
    conversation, so a long chain costs more than its last turn): the oldest go first. Kept as JSON text,
    so what `get` returns is the caller's to change. Thread-safe."""

    def __init__(self, max_entries: int = 256, max_chars: int = 16_000_000):
        self.max_entries, self.max_chars = max_entries, max_chars
        self._items: OrderedDict[str, str] = OrderedDict()
        self.chars = 0
        self._lock = threading.Lock()

    def remember(self, ctx: ResponseContext, content: str | None, calls: list[dict]) -> bool:
        """Keep ctx's conversation and its output (only if the request's `store` is not false, and the
        whole fits the bound); returns whether it was kept."""
        if not ctx.store:
            return False
        turn: dict = {"role": "assistant", "content": content or ""}
        for c in calls or ():
            name, args = c["function"]["name"], c["function"]["arguments"]
            args = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
            turn.setdefault("tool_calls", []).append({"id": c["id"], "type": "function",
                                                      "function": {"name": name, "arguments": args}})
        text = json.dumps(ctx.messages + [turn], ensure_ascii=False)
        if len(text) > self.max_chars:
            return False
        with self._lock:
            self._drop(ctx.id)
            self._items[ctx.id] = text
            self.chars += len(text)
            while len(self._items) > self.max_entries or self.chars > self.max_chars:
                self._drop(next(iter(self._items)))
        return True

    def get(self, rid: str) -> list[dict] | None:
        with self._lock:
            text = self._items.get(rid)
            if text is None:
                return None
            self._items.move_to_end(rid)
        return json.loads(text)

    def _drop(self, rid: str) -> None:
        text = self._items.pop(rid, None)
        if text is not None:
            self.chars -= len(text)

    def __len__(self) -> int:
        return len(self._items)
