"""The Responses API (POST /v1/responses) with the real openai client's `responses.create` and
`responses.stream`: text and message input, instructions, previous_response_id, structured output via
text.format, and a function-tool loop (call, output fed back, answer), on the real smollm-self bundle
with Qwen2.5's chat template (tests/test_serve_structured.py). Greedy text equals the chat route's."""
from __future__ import annotations

import json

import jsonschema
import openai
import pytest

from edgespec.serve.process import ServeProcess
from test_serve import bundle_path
from test_serve_structured import QWEN_TEMPLATE, with_template

pytestmark = pytest.mark.real

ADD = {"type": "function", "name": "add", "description": "Add two integers",
       "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                      "required": ["a", "b"], "additionalProperties": False}}


@pytest.fixture(scope="module")
def server(request, tmp_path_factory):
    path = with_template(bundle_path(request), QWEN_TEMPLATE, tmp_path_factory.mktemp("resp") / "smollm-qwen")
    srv = ServeProcess(path, "--max-tokens-cap", "64", "--model-name", "smollm")
    yield srv
    assert srv.stop() == 0, "".join(srv.lines)


def test_create_equals_the_chat_route_and_continues_with_previous_response_id(server):
    client = server.client()
    r = client.responses.create(model="smollm", input="Name a colour.", max_output_tokens=24, temperature=0)
    chat = client.chat.completions.create(model="smollm", messages=[{"role": "user", "content": "Name a colour."}],
                                          max_tokens=24, temperature=0)
    assert r.output_text == chat.choices[0].message.content
    assert (r.usage.input_tokens, r.usage.output_tokens) == (chat.usage.prompt_tokens, chat.usage.completion_tokens)
    assert r.status == ("incomplete" if chat.choices[0].finish_reason == "length" else "completed")
    r2 = client.responses.create(model="smollm", input="And another?", previous_response_id=r.id,
                                 max_output_tokens=8, temperature=0, instructions="Answer in one word.")
    history = [{"role": "system", "content": "Answer in one word."}, {"role": "user", "content": "Name a colour."},
               {"role": "assistant", "content": r.output_text}, {"role": "user", "content": "And another?"}]
    again = client.chat.completions.create(model="smollm", messages=history, max_tokens=8, temperature=0)
    assert r2.output_text == again.choices[0].message.content and r2.previous_response_id == r.id
    assert r2.usage.input_tokens == again.usage.prompt_tokens
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="smollm", input="x", previous_response_id="resp_" + "0" * 24)


def test_stream_deltas_make_the_final_text(server):
    client = server.client()
    msgs = [{"role": "developer", "content": "Be brief."}, {"role": "user", "content": [
        {"type": "input_text", "text": "Say hello."}]}]
    plain = client.responses.create(model="smollm", input=msgs, max_output_tokens=64, temperature=0)
    with client.responses.stream(model="smollm", input=msgs, max_output_tokens=64, temperature=0) as stream:
        events = list(stream)
    types = [e.type for e in events]
    assert types[:2] == ["response.created", "response.in_progress"]
    assert types[-1] in ("response.completed", "response.incomplete")
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == plain.output_text
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[-1].response.output_text == plain.output_text


def test_text_format_json_schema(server):
    schema = {"type": "object", "properties": {"colour": {"type": "string", "maxLength": 12}},
              "required": ["colour"], "additionalProperties": False}
    r = server.client().responses.create(model="smollm", input="A colour as JSON.", temperature=0,
                                         text={"format": {"type": "json_schema", "name": "c", "schema": schema}})
    jsonschema.validate(json.loads(r.output_text), schema)
    with pytest.raises(openai.BadRequestError, match="text.format"):
        server.client().responses.create(model="smollm", input="x", text={"format": {"type": "json_schema",
                                                                                     "name": "c", "schema": []}})


def test_a_function_tool_loop(server):
    client = server.client()
    r = client.responses.create(model="smollm", input="What is 2 + 3? Use the tool.", tools=[ADD],
                                tool_choice="required", temperature=0)
    (call,) = [o for o in r.output if o.type == "function_call"]
    args = json.loads(call.arguments)
    assert call.name == "add" and set(args) == {"a", "b"}
    result = {"type": "function_call_output", "call_id": call.call_id, "output": str(args["a"] + args["b"])}
    answer = client.responses.create(model="smollm", previous_response_id=r.id, input=[result], tools=[ADD],
                                     tool_choice="none", max_output_tokens=24, temperature=0)
    assert answer.output_text and not [o for o in answer.output if o.type == "function_call"]
    with client.responses.stream(model="smollm", input="What is 2 + 3? Use the tool.", tools=[ADD],
                                 tool_choice="required", temperature=0) as stream:
        events = list(stream)
    done = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert [json.loads(e.arguments) for e in done] == [args]
    assert events[-1].type == "response.completed"


def test_an_agent_sdk_that_defaults_to_the_responses_api(server):
    """The OpenAI Agents SDK (its default model class speaks the Responses API) runs a tool and answers."""
    import agents        # openai-agents: the [test] extra
    from openai import AsyncOpenAI

    agents.set_default_openai_client(AsyncOpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0))
    agents.set_tracing_disabled(True)
    calls = []

    @agents.function_tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        calls.append((a, b))
        return a + b

    settings = agents.ModelSettings(temperature=0, tool_choice="required")
    agent = agents.Agent(name="calc", instructions="Use the add tool.", tools=[add], model="smollm",
                         model_settings=settings, tool_use_behavior="stop_on_first_tool")
    result = agents.Runner.run_sync(agent, "What is 2 + 3?")
    assert len(calls) == 1 and result.final_output == str(sum(calls[0]))
    assert isinstance(agent.model, str) and agents.Runner.run_sync(
        agents.Agent(name="chat", model="smollm", model_settings=agents.ModelSettings(temperature=0)),
        "Say hi").final_output
