"""Structured output and tool calls for the OpenAI server (docs/structured-output.md).

- `response_format` ({"type": "json_object"} or {"type": "json_schema", "json_schema": {...}}) becomes a
  generate() constraint (runtime/samplers/grammar.py).
- `tools` are rendered through the model's own chat template (its `tools` variable: Qwen2.5's, Hermes
  style); a template that never reads `tools` gets a 400. The model answers tool calls in the format
  that template teaches, `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`, and under
  `tool_choice` the answer is constrained by a Lark grammar (`tool_grammar`): `required` = calls,
  a named function = exactly one call of it, `auto` = calls or a text answer (which then cannot start
  with "<"), `none` = plain text, the tools still shown. Arguments follow each tool's JSON schema.
  "Calls" is ONE call unless the request says `parallel_tool_calls: true` (llama-server's default:
  small models, allowed a list, repeat a call until max_tokens); then at most MAX_CALLS, and the answer
  ends at the first repeated call (serve/calls.CallGuard).
- The answer is parsed back into OpenAI's `tool_calls`, streamed or not: serve/calls.py.
- Messages: `role: "tool"` results (`tool_call_id`, `content`) and assistant messages carrying
  `tool_calls` (their `arguments` JSON text is given to the template as an object, as HF templates
  expect), each checked (an id, a name, JSON arguments; a result answers a call made before it).
"""
from __future__ import annotations

import json
import re

from edgespec import jsonio
from edgespec.errors import GenerationError
from edgespec.runtime.samplers.grammar import TOOL_CALL_JSON
from edgespec.serve.calls import (CLOSE, OPEN, CallGuard, LooseCalls, ToolCallStream, made_calls,  # noqa: F401
                                  parse_tool_calls)
from edgespec.serve.errors import APIError

_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
MAX_CALLS = 8         # calls in one answer where parallel_tool_calls is true
TEXT_ONLY = 'start: TEXT\nTEXT: /[^<](.|\n)*/\n'     # tool_choice "auto"'s text answer (serve/calls.CallGuard)


def _bad(message: str, param: str) -> APIError:
    return APIError(400, message, param=param)


# ---------------------------------------------------------------------------------- request fields
def check_response_format(rf) -> dict | None:
    """The generate() constraint of a `response_format` (None for text)."""
    if rf is None:
        return None
    if not isinstance(rf, dict) or not isinstance(rf.get("type"), str):
        raise _bad("'response_format' must be an object with a 'type'", "response_format")
    kind = rf["type"]
    if kind == "text":
        return None
    if kind == "json_object":          # llama-server's way to ask for a schema: json_object + schema
        schema = rf.get("schema")
        if schema is None:
            return {"response_format": {"type": "json_object"}}
        return {"json_schema": _schema(schema, "response_format.schema")}
    if kind == "json_schema":
        spec = rf.get("json_schema")
        if spec is None and "schema" in rf:    # llama-server's bare form {"type": "json_schema", "schema": ...}
            return {"json_schema": _schema(rf["schema"], "response_format.schema")}
        if not isinstance(spec, dict):
            raise _bad("'response_format.json_schema' must be an object with 'name' and 'schema'",
                       "response_format.json_schema")
        name = spec.get("name")
        if name is not None and (not isinstance(name, str) or not _NAME.match(name)):
            raise _bad("'response_format.json_schema.name' must be a string of a-z, A-Z, 0-9, _ and - (at most 64)",
                       "response_format.json_schema.name")
        return {"json_schema": _schema(spec.get("schema", {}), "response_format.json_schema.schema")}
    raise _bad(f"'response_format.type' must be 'text', 'json_object' or 'json_schema', got {kind!r}",
               "response_format.type")


def _schema(schema, param: str) -> dict:
    if not isinstance(schema, dict):
        raise _bad(f"'{param}' must be a JSON schema object", param)
    return schema


def check_tools(tools) -> list[dict]:
    if tools is None or tools == []:
        return []
    if not isinstance(tools, list):
        raise _bad("'tools' must be an array of tool objects", "tools")
    out, names = [], set()
    for i, t in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(t, dict) or t.get("type") != "function" or not isinstance(t.get("function"), dict):
            raise _bad(f"'{where}' must be {{\"type\": \"function\", \"function\": {{...}}}}", where)
        f = t["function"]
        name = f.get("name")
        if not isinstance(name, str) or not _NAME.match(name):
            raise _bad(f"'{where}.function.name' must be a string of a-z, A-Z, 0-9, _ and - (at most 64)",
                       f"{where}.function.name")
        if name in names:
            raise _bad(f"'{where}.function.name' {name!r} is given twice", f"{where}.function.name")
        names.add(name)
        params = f.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(params, dict):
            raise _bad(f"'{where}.function.parameters' must be a JSON schema object", f"{where}.function.parameters")
        if f.get("description") is not None and not isinstance(f["description"], str):
            raise _bad(f"'{where}.function.description' must be a string", f"{where}.function.description")
        out.append({"type": "function", "function": {k: v for k, v in
                                                     (("name", name), ("description", f.get("description")),
                                                      ("parameters", params)) if v is not None}})
    return out


def check_tool_choice(choice, tools: list[dict]) -> str:
    """"auto" | "none" | "required" | the name of one function."""
    if choice is None:
        return "auto" if tools else "none"
    if isinstance(choice, str):
        if choice not in ("auto", "none", "required"):
            raise _bad(f"'tool_choice' must be 'auto', 'none', 'required' or a named function, got {choice!r}",
                       "tool_choice")
        if choice != "none" and not tools:
            raise _bad(f"'tool_choice' {choice!r} needs 'tools'", "tool_choice")
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("function"), dict):
        name = choice["function"].get("name")
        if name not in {t["function"]["name"] for t in tools}:
            raise _bad(f"'tool_choice.function.name' {name!r} is not one of the given tools", "tool_choice.function.name")
        return name
    raise _bad("'tool_choice' must be 'auto', 'none', 'required' or {\"type\": \"function\", \"function\": {\"name\": ...}}",
               "tool_choice")


def check_message(m: dict, where: str) -> dict:
    """The tool keys of a chat message (`tool_call_id` of a tool result, `tool_calls` of an assistant
    turn) checked, any other key but role and content refused unless null (a client that sends back the
    message it got sends `refusal: null`); the template gets `arguments` as an object."""
    role = m.get("role")
    allowed = {"role", "content", "name"} | ({"tool_calls"} if role == "assistant" else set()) | \
        ({"tool_call_id"} if role == "tool" else set())
    for key in m:
        if key not in allowed and m[key] is not None:
            raise APIError(400, f"'{where}.{key}' is not supported by this server for role {role!r} (messages take "
                           "'role' and 'content'; tool results 'tool_call_id', assistant turns 'tool_calls')",
                           param=f"{where}.{key}", code="unsupported_parameter")
    out = {"role": role}
    if m.get("name") is not None and not isinstance(m["name"], str):     # accepted (agent frameworks send it)
        raise _bad(f"'{where}.name' must be a string", f"{where}.name")
    if role == "tool":
        if not isinstance(m.get("tool_call_id"), str) or not m["tool_call_id"]:
            raise _bad(f"'{where}.tool_call_id' is required for role 'tool' (the id of the call it answers)",
                       f"{where}.tool_call_id")
        out["tool_call_id"] = m["tool_call_id"]
    if role == "assistant" and m.get("tool_calls") is not None:
        calls = m["tool_calls"]
        if not isinstance(calls, list) or not calls:
            raise _bad(f"'{where}.tool_calls' must be a non-empty array", f"{where}.tool_calls")
        out["tool_calls"] = [_check_call(c, f"{where}.tool_calls[{j}]") for j, c in enumerate(calls)]
    return out


def _check_call(c, where: str) -> dict:
    if not isinstance(c, dict) or c.get("type", "function") != "function" or not isinstance(c.get("function"), dict):
        raise _bad(f"'{where}' must be {{\"id\", \"type\": \"function\", \"function\": {{\"name\", \"arguments\"}}}}", where)
    f = c["function"]
    if not isinstance(c.get("id"), str) or not c["id"]:
        raise _bad(f"'{where}.id' is required (a non-empty string: the tool result's tool_call_id names it)",
                   f"{where}.id")
    if not isinstance(f.get("name"), str) or not f["name"]:
        raise _bad(f"'{where}.function.name' is required (a non-empty string)", f"{where}.function.name")
    args = f.get("arguments", "{}")
    if isinstance(args, str):
        try:
            args = jsonio.loads(args) if args.strip() else {}
        except ValueError:
            raise _bad(f"'{where}.function.arguments' is not valid JSON", f"{where}.function.arguments") from None
    if not isinstance(args, dict):
        raise _bad(f"'{where}.function.arguments' must be a JSON object (or its JSON text), got "
                   f"{type(args).__name__}", f"{where}.function.arguments")
    return {"id": c.get("id"), "type": "function", "function": {"name": f["name"], "arguments": args}}


def check_history(messages: list[dict]) -> None:
    """Each tool result answers a call an earlier assistant turn made (its tool_call_id is that call's id)."""
    ids: set[str] = set()
    for i, m in enumerate(messages):
        ids.update(c["id"] for c in m.get("tool_calls", ()))
        if m["role"] == "tool" and m["tool_call_id"] not in ids:
            raise _bad(f"'messages[{i}].tool_call_id' {m['tool_call_id'][:40]!r} answers no tool call of an earlier "
                       "assistant message", f"messages[{i}].tool_call_id")


# ---------------------------------------------------------------------------------- prompt
def template_takes_tools(template: str | None) -> bool:
    """Whether a chat template reads the `tools` variable at all (Qwen2.5's does; SmolLM2's does not)."""
    return bool(template) and re.search(r"\btools\b", template) is not None


def encode_chat(dec, messages: list[dict], tools: list[dict], parse_special: bool = False) -> list[int]:
    """Target ids of the conversation rendered with `tools` (decoder.encode_prompt: message content
    never becomes control tokens unless `parse_special`)."""
    if tools and not template_takes_tools(dec.bundle.chat_template):
        raise _bad("this model's chat template has no tool support (it never reads 'tools'); use a model whose "
                   "template takes tools, e.g. Qwen2.5", "tools")
    return dec.encode_prompt(messages, chat=True, tools=tools or None, parse_special=parse_special)


# ---------------------------------------------------------------------------------- the grammar
def _marker(tokenizer, text: str) -> str:
    """A Lark item for <tool_call> / </tool_call>: the token by id where the vocabulary has it as one
    added token (Qwen2.5), else the literal text."""
    tid = tokenizer.token_to_id(text)
    return f"<[{tid}]>" if tid is not None else json.dumps(text)


def tool_grammar(tokenizer, tools: list[dict], choice: str, parallel: bool = False) -> str | None:
    """The Lark grammar of the answer under `tool_choice` (None: unconstrained): one call, or with
    `parallel` up to MAX_CALLS."""
    if choice == "none" or not tools:
        return None
    chosen = [t for t in tools if choice in ("auto", "required") or t["function"]["name"] == choice]
    bodies = [{"type": "object", "properties": {"name": {"const": t["function"]["name"]},
                                                "arguments": t["function"]["parameters"]},
               "required": ["name", "arguments"], "additionalProperties": False} for t in chosen]
    body = dict(bodies[0] if len(bodies) == 1 else {"anyOf": bodies}, **{"x-guidance": TOOL_CALL_JSON})
    many = parallel and choice in ("auto", "required")
    lines = [f"start: calls{' | TEXT' if choice == 'auto' else ''}",
             f'calls: call ("\\n" call)~0..{MAX_CALLS - 1}' if many else "calls: call",
             f'call: {_marker(tokenizer, OPEN)} "\\n" body "\\n" {_marker(tokenizer, CLOSE)}',
             "body: %json " + json.dumps(body)]
    if choice == "auto":
        lines.append(r"TEXT: /[^<](.|\n)*/")
    return "\n".join(lines) + "\n"


def constraint(dec, req) -> dict | None:
    """The generate() constraint of a checked chat request, compiled once here so that a bad schema
    is a 400 before any model runs (GenerationError -> 400 naming the field)."""
    if req.tools and req.tool_choice != "none":
        if req.response_format:
            raise _bad("give 'response_format' or 'tools' with tool_choice other than 'none', not both",
                       "response_format")
        kw, param = {"grammar": tool_grammar(dec.bundle.target.tokenizer, req.tools, req.tool_choice,
                                             req.parallel_tool_calls)}, "tools"
    else:
        kw, param = req.response_format, "response_format"
    if not kw:
        return None
    try:
        dec.grammar_state(**kw)
    except GenerationError as exc:
        raise _bad(f"'{param}': {exc}", param) from None
    return kw
