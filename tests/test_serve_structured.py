"""Structured output and tool calls through `edgespec serve` with the real openai client (serve/tools.py,
runtime/samplers/grammar.py), on the real smollm-self bundle:
- its own chat template (no tool support): response_format json_object / json_schema (the client's
  `beta.chat.completions.parse` with a pydantic model), the greedy answer equal to the in-process
  decoder's; `tools` refused with a 400 saying the template has no tool support;
- the same weights given Qwen2.5's chat template (tests/data/qwen2.5_chat_template.jinja, which takes
  `tools` and teaches the <tool_call> format; SmolLM2 speaks the same ChatML): a tools round trip
  (call, tool result, final answer), each tool_choice, streamed tool-call deltas assembling into the
  non-streamed call;
- bad bodies: a 400 naming the field, before any model runs."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Literal

import openai
import pydantic
import pytest

from edgespec.runtime import Bundle, SpeculativeDecoder
from test_serve import Server, bundle_path  # tests/ is on sys.path (conftest.py)

pytestmark = pytest.mark.real
pytest.importorskip("llguidance")

QWEN_TEMPLATE = Path(__file__).parent / "data" / "qwen2.5_chat_template.jinja"
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                                    "unit": {"enum": ["celsius", "fahrenheit"]}},
                   "required": ["city", "unit"], "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "add", "description": "Add two integers.",
        "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                       "required": ["a", "b"], "additionalProperties": False}}}]
ASK = [{"role": "user", "content": "What is the weather in Paris, in celsius?"}]


class City(pydantic.BaseModel):
    name: str = pydantic.Field(max_length=30)
    country: str = pydantic.Field(max_length=30)
    population_millions: float
    continent: Literal["Africa", "Asia", "Europe", "North America", "South America", "Oceania"]


def with_template(src: Path, template: Path, out: Path) -> Path:
    """A copy of bundle `src` (weights hard-linked) whose target chat template is `template`."""
    shutil.copytree(src, out, copy_function=os.link)
    rel = "target/chat_template.jinja"
    (out / rel).unlink()
    shutil.copyfile(template, out / rel)
    manifest = json.loads((out / "manifest.json").read_text())
    data = (out / rel).read_bytes()
    manifest["files"][rel] = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    (out / "manifest.json").unlink()
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2))
    return out


@pytest.fixture(scope="module")
def bundle(request):
    return bundle_path(request)


@pytest.fixture(scope="module")
def server(bundle):
    srv = Server(bundle, "--max-tokens-cap", "96", "--model-name", "smollm")
    yield srv
    assert srv.stop() == 0, "".join(srv.lines)


@pytest.fixture(scope="module")
def tool_server(bundle, tmp_path_factory):
    path = with_template(bundle, QWEN_TEMPLATE, tmp_path_factory.mktemp("tools") / "smollm-qwen-template")
    srv = Server(path, "--max-tokens-cap", "96", "--model-name", "smollm")
    yield srv
    assert srv.stop() == 0, "".join(srv.lines)


@pytest.fixture(scope="module")
def ref(bundle):
    return SpeculativeDecoder(Bundle.load(bundle, verify="fast"), strategy="ar", threads=1)


def test_parse_with_a_pydantic_model(server):
    client = server.client()
    msgs = [{"role": "user", "content": "Give me facts about Tokyo as JSON."}]
    got = client.beta.chat.completions.parse(model="smollm", messages=msgs, response_format=City, temperature=0,
                                             max_tokens=96)
    city = got.choices[0].message.parsed
    assert isinstance(city, City), got.choices[0].message.content
    assert got.choices[0].finish_reason == "stop"
    assert City.model_validate_json(got.choices[0].message.content) == city


def test_json_schema_and_object_equal_the_decoder(server, ref):
    client = server.client()
    schema = City.model_json_schema()
    msgs = [{"role": "user", "content": "Describe Paris as JSON."}]
    for rf, kw in ((({"type": "json_schema", "json_schema": {"name": "city", "schema": schema}}), dict(json_schema=schema)),
                   ({"type": "json_object"}, dict(response_format={"type": "json_object"}))):
        want = ref.generate(msgs, max_new_tokens=64, chat=True, **kw)
        got = client.chat.completions.create(model="smollm", messages=msgs, response_format=rf, temperature=0,
                                             max_tokens=64)
        assert got.choices[0].message.content == want.text
        assert got.choices[0].finish_reason == want.finish_reason
        if want.finish_reason == "stop":
            assert isinstance(json.loads(want.text), dict)
        chunks = list(client.chat.completions.create(model="smollm", messages=msgs, response_format=rf, temperature=0,
                                                     max_tokens=64, stream=True))
        assert "".join(c.choices[0].delta.content or "" for c in chunks) == want.text


def test_cut_json_says_length(server):
    got = server.client().chat.completions.create(
        model="smollm", messages=[{"role": "user", "content": "A long JSON list of fruits."}],
        response_format={"type": "json_object"}, temperature=0, max_tokens=5)
    assert got.choices[0].finish_reason == "length"
    with pytest.raises(ValueError):
        json.loads(got.choices[0].message.content)


def test_tools_on_a_template_without_tool_support(server):
    with pytest.raises(openai.BadRequestError) as e:
        server.client().chat.completions.create(model="smollm", messages=ASK, tools=TOOLS, max_tokens=8)
    assert e.value.body["param"] == "tools" and "no tool support" in e.value.body["message"]


@pytest.mark.parametrize("body,param", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "strin"}}}},
     "response_format"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "string", "pattern": "[a-"}}}},
     "response_format"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "a b", "schema": {}}}},
     "response_format.json_schema.name"),
    ({"response_format": {"type": "xml"}}, "response_format.type"),
    ({"response_format": "json"}, "response_format"),
    ({"tools": [{"type": "function", "function": {"name": "bad name"}}]}, "tools[0].function.name"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice.function.name"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"messages": ASK + [{"role": "tool", "content": "sunny"}]}, "messages[1].tool_call_id"),
    ({"messages": ASK + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "add", "arguments": "{not json"}}]}]},
     "messages[1].tool_calls[0].function.arguments"),
    ({"messages": ASK + [{"role": "user", "content": "x", "tool_call_id": "c1"}]}, "messages[1].tool_call_id"),
])
def test_bad_bodies_name_the_field(tool_server, body, param):
    client = tool_server.client()
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(**dict(dict(model="smollm", messages=ASK, max_tokens=8), **body))
    assert e.value.body["param"] == param, e.value.body
    assert client.chat.completions.create(model="smollm", messages=ASK, max_tokens=2).choices   # still serving


def _call(client, max_tokens=96, **kw):
    return client.chat.completions.create(model="smollm", tools=TOOLS, temperature=0, max_tokens=max_tokens, **kw)


def test_tools_round_trip(tool_server):
    client = tool_server.client()
    got = _call(client, messages=ASK, tool_choice="required")
    choice = got.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.tool_calls, choice
    call = choice.message.tool_calls[0]
    assert call.type == "function" and call.function.name in ("get_weather", "add") and call.id.startswith("call_")
    args = json.loads(call.function.arguments)
    if call.function.name == "get_weather":
        assert set(args) == {"city", "unit"} and args["unit"] in ("celsius", "fahrenheit")
    # the tool's result goes back as a role "tool" message; the model answers in text
    history = ASK + [{"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
                     {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temperature": 21})}]
    final = _call(client, messages=history, tool_choice="none", max_tokens=24)
    assert final.choices[0].message.tool_calls is None and final.choices[0].message.content
    # prefix reuse: the second turn's prompt starts with the first's
    assert final.usage.prompt_tokens > got.usage.prompt_tokens


def test_named_tool_choice_and_auto(tool_server):
    client = tool_server.client()
    got = _call(client, messages=[{"role": "user", "content": "What is 2 plus 3?"}],
                tool_choice={"type": "function", "function": {"name": "add"}})
    calls = got.choices[0].message.tool_calls
    assert len(calls) == 1 and calls[0].function.name == "add"
    assert set(json.loads(calls[0].function.arguments)) == {"a", "b"}
    auto = _call(client, messages=ASK, tool_choice="auto")
    msg = auto.choices[0].message
    if msg.tool_calls:                    # a call, valid by construction, or a text answer
        assert auto.choices[0].finish_reason == "tool_calls"
        assert all(c.function.name in ("get_weather", "add") for c in msg.tool_calls)
        json.loads(msg.tool_calls[0].function.arguments)
    else:
        assert msg.content and not msg.content.startswith("<")


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_streamed_tool_call_deltas_assemble_into_the_same_call(tool_server, choice):
    client = tool_server.client()
    whole = _call(client, messages=ASK, tool_choice=choice).choices[0]
    calls: dict[int, dict] = {}
    finish, pieces = None, 0
    for chunk in _call(client, messages=ASK, tool_choice=choice, stream=True):
        c = chunk.choices[0]
        finish = c.finish_reason or finish
        for d in c.delta.tool_calls or []:
            pieces += 1
            slot = calls.setdefault(d.index, {"name": "", "arguments": "", "id": None})
            slot["id"] = d.id or slot["id"]
            if d.function and d.function.name:
                slot["name"] += d.function.name
            if d.function and d.function.arguments:
                slot["arguments"] += d.function.arguments
    assert finish == whole.finish_reason == "tool_calls"
    assert [(c["name"], c["arguments"]) for _, c in sorted(calls.items())] == \
        [(c.function.name, c.function.arguments) for c in whole.message.tool_calls]
    assert all(c["id"] for c in calls.values()) and pieces > len(calls)     # arguments came in pieces
