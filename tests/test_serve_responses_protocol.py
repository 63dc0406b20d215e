"""POST /v1/responses without HTTP or a model (serve/responses.py, serve/response_events.py): the
Responses body becomes the chat route's Request, every refusal is a 4xx naming the Responses field, and
every object and event this server writes is one the openai package reads: validated with its pydantic
types, accumulated by its own stream state (what `client.responses.stream(...)` runs), and read by the
real client over a mock transport."""
from __future__ import annotations

import json

import pytest

openai = pytest.importorskip("openai")
pydantic = pytest.importorskip("pydantic")

from openai.lib.streaming.responses._responses import ResponseStreamState  # noqa: E402
from openai.types.responses import Response, ResponseStreamEvent  # noqa: E402

from edgespec.serve import protocol  # noqa: E402
from edgespec.serve.calls import ToolCallStream, parse_tool_calls  # noqa: E402
from edgespec.serve.errors import APIError  # noqa: E402
from edgespec.serve.response_events import ResponseStream, response_object, sse, status_of  # noqa: E402
from edgespec.serve.responses import ResponseMemory, parse_responses  # noqa: E402

MODEL = "tiny"
EVENT = pydantic.TypeAdapter(ResponseStreamEvent)
TOOL = {"type": "function", "name": "get_weather", "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
CALL_TEXT = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


def parse(memory=None, **body):
    return parse_responses({"model": MODEL, **body}, MODEL, memory if memory is not None else ResponseMemory())


def call(cid="call_1", name="get_weather", args='{"city": "Paris"}'):
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": args}}


# ---------------------------------------------------------------------------------- requests
def test_string_input_is_one_user_message():
    req, ctx = parse(input="hi")
    assert isinstance(req, protocol.Request) and req.kind == "chat"
    assert req.prompt == [{"role": "user", "content": "hi"}]
    assert (req.max_tokens, req.temperature, req.tools, req.tool_choice, req.stream) == (None, 1.0, [], "none", False)
    assert ctx.id.startswith("resp_") and ctx.store and ctx.messages == [{"role": "user", "content": "hi"}]


def test_message_items_with_parts_and_sampling_fields():
    items = [{"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "Be brief."}]},
             {"role": "user", "content": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}]},
             # an output item sent back as input, as clients do (input += response.output)
             {"type": "message", "id": "msg_1", "status": "completed", "role": "assistant",
              "content": [{"type": "output_text", "text": "ok", "annotations": [], "logprobs": []}]},
             {"role": "user", "content": "again"}]
    req, ctx = parse(input=items, max_output_tokens=9, temperature=0.5, top_p=0.9, top_k=4, min_p=0.1, seed=7,
                     stream=True, user="u", metadata={"k": "v"}, truncation="disabled", include=[], reasoning=None)
    assert req.prompt == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "ab"},
                          {"role": "assistant", "content": "ok"}, {"role": "user", "content": "again"}]
    assert (req.max_tokens, req.temperature, req.top_p, req.top_k, req.min_p, req.seed, req.stream) == \
        (9, 0.5, 0.9, 4, 0.1, 7, True)
    assert ctx.echo["max_output_tokens"] == 9 and ctx.echo["metadata"] == {"k": "v"} and ctx.echo["top_p"] == 0.9
    assert not req.not_applied


def test_instructions_come_first():
    req, ctx = parse(input="hi", instructions="You are terse.")
    assert req.prompt[0] == {"role": "system", "content": "You are terse."}
    assert ctx.messages == [{"role": "user", "content": "hi"}]        # not part of the remembered conversation
    assert ctx.echo["instructions"] == "You are terse."


def test_function_calls_and_outputs_become_chat_turns():
    items = [{"role": "user", "content": "weather in Paris and Rome?"},
             {"type": "function_call", "call_id": "call_a", "name": "get_weather", "arguments": '{"city": "Paris"}'},
             {"type": "function_call", "id": "fc_1", "status": "completed", "call_id": "call_b",
              "name": "get_weather", "arguments": '{"city": "Rome"}'},
             {"type": "function_call_output", "call_id": "call_a", "output": "sunny"},
             {"type": "function_call_output", "call_id": "call_b", "output": [{"type": "input_text", "text": "rain"}]}]
    req, ctx = parse(input=items, tools=[TOOL], parallel_tool_calls=True)
    assert ctx.messages[1] == {"role": "assistant", "content": "", "tool_calls": [
        call("call_a"), call("call_b", args='{"city": "Rome"}')]}
    assert ctx.messages[2:] == [{"role": "tool", "tool_call_id": "call_a", "content": "sunny"},
                                {"role": "tool", "tool_call_id": "call_b", "content": "rain"}]
    assert len(req.prompt) == 4 and req.prompt[1]["tool_calls"][1]["function"]["arguments"] == {"city": "Rome"}
    assert req.tools == [{"type": "function", "function": {"name": "get_weather", "description": TOOL["description"],
                                                           "parameters": TOOL["parameters"]}}]
    assert (req.tool_choice, req.parallel_tool_calls) == ("auto", True)
    # the conversation is in the shape the chat route takes as it is
    assert protocol.parse_chat({"model": MODEL, "messages": ctx.messages}, MODEL).prompt == req.prompt


def test_assistant_text_then_calls_is_one_turn():
    items = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "Let me look."},
             {"type": "function_call", "call_id": "call_a", "name": "get_weather", "arguments": "{}"}]
    _, ctx = parse(input=items, tools=[TOOL])
    assert ctx.messages[1] == {"role": "assistant", "content": "Let me look.",
                               "tool_calls": [call("call_a", args="{}")]}


def test_tool_choice_forms():
    assert parse(input="x", tools=[TOOL], tool_choice="required")[0].tool_choice == "required"
    req, ctx = parse(input="x", tools=[TOOL], tool_choice={"type": "function", "name": "get_weather"})
    assert req.tool_choice == "get_weather"
    assert ctx.echo["tool_choice"] == {"type": "function", "name": "get_weather"}
    assert parse(input="x", tools=[TOOL], tool_choice="none")[1].echo["tool_choice"] == "none"


def test_previous_response_id_chains_without_its_instructions():
    memory = ResponseMemory()
    _, first = parse(memory, input="My name is Ada.", instructions="Old instructions.")
    assert memory.remember(first, "Hello Ada.", [])
    req, second = parse(memory, input="What is my name?", instructions="New instructions.",
                        previous_response_id=first.id)
    assert req.prompt == [{"role": "system", "content": "New instructions."},
                          {"role": "user", "content": "My name is Ada."},
                          {"role": "assistant", "content": "Hello Ada."},
                          {"role": "user", "content": "What is my name?"}]
    assert second.echo["previous_response_id"] == first.id and second.echo["instructions"] == "New instructions."
    # a call the stored response made, answered in the next request
    memory.remember(second, None, [call("call_z")])
    req, third = parse(memory, input=[{"type": "function_call_output", "call_id": "call_z", "output": "12C"}],
                       tools=[TOOL], previous_response_id=second.id)
    assert req.prompt[-2]["tool_calls"][0]["id"] == "call_z" and req.prompt[-1]["role"] == "tool"
    assert third.messages[:2] == first.messages + [{"role": "assistant", "content": "Hello Ada."}]


def test_store_false_is_not_remembered():
    memory = ResponseMemory()
    _, ctx = parse(memory, input="hi", store=False)
    assert not memory.remember(ctx, "x", []) and len(memory) == 0
    assert ctx.echo["store"] is False
    e = refused("previous_response_id", 404, memory=memory, input="again", previous_response_id=ctx.id)
    assert e.code == "previous_response_not_found"


def test_text_format_is_chats_response_format():
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    req, ctx = parse(input="x", text={"format": {"type": "json_schema", "name": "num", "schema": schema,
                                                 "strict": True}})
    chat = protocol.parse_chat({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "response_format": {
        "type": "json_schema", "json_schema": {"name": "num", "schema": schema, "strict": True}}}, MODEL)
    assert req.response_format == chat.response_format == {"json_schema": schema}
    assert ctx.echo["text"]["format"]["name"] == "num"
    req, _ = parse(input="x", text={"format": {"type": "json_object"}})
    chat = protocol.parse_chat({"model": MODEL, "messages": [{"role": "user", "content": "x"}],
                                "response_format": {"type": "json_object"}}, MODEL)
    assert req.response_format == chat.response_format
    assert parse(input="x", text={"format": {"type": "text"}})[0].response_format is None


def test_accepted_but_not_applied_fields_are_reported():
    req, ctx = parse(input="x", reasoning={"effort": "high"}, truncation="auto", text={"verbosity": "low"},
                     stream=True, stream_options={"include_obfuscation": True})
    assert set(req.not_applied) >= {"reasoning", "truncation", "text.verbosity", "stream_options.include_obfuscation"}
    assert ctx.echo["truncation"] == "auto"
    assert not parse(input="x", reasoning={"effort": None})[0].not_applied


def refused(param, status=400, memory=None, **body):
    with pytest.raises(APIError) as e:
        parse(memory, **body)
    assert e.value.status == status and e.value.param == param, e.value.body()
    assert 400 <= e.value.status < 500 and "\n" not in e.value.message
    assert set(e.value.body()["error"]) == {"message", "type", "param", "code"}
    return e.value


FC = {"type": "function_call", "call_id": "call_a", "name": "get_weather", "arguments": "{}"}


@pytest.mark.parametrize("body, param", [
    ({"input": "x", "stop": ["\n"]}, "stop"),
    ({"input": "x", "messages": []}, "messages"),
    ({}, "input"),
    ({"input": []}, "input"),
    ({"input": 3}, "input"),
    ({"input": [{"type": "input_image", "image_url": "http://x"}]}, "input[0].type"),
    ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0].type"),
    ({"input": [{"type": "reasoning", "summary": []}]}, "input[0].type"),
    ({"input": [{"role": "user", "content": [{"type": "input_text", "text": "a"}, {"type": "input_image"}]}]},
     "input[0].content[1]"),
    ({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]}, "input[0].content[0]"),
    ({"input": [{"role": "tool", "content": "x"}]}, "input[0].role"),
    ({"input": [{"role": "user", "content": "x", "extra": 1}]}, "input[0].extra"),
    ({"input": [{"role": "user", "content": 5}]}, "input[0].content"),
    ({"input": [{"role": "user", "content": "q"}, dict(FC, arguments="{not")], "tools": [TOOL]}, "input[1].arguments"),
    ({"input": [{"role": "user", "content": "q"}, dict(FC, arguments="[1]")], "tools": [TOOL]}, "input[1].arguments"),
    ({"input": [{"role": "user", "content": "q"}, dict(FC, call_id="")]}, "input[1].call_id"),
    ({"input": [{"type": "function_call_output", "call_id": "call_x", "output": "r"}]}, "input[0].call_id"),
    ({"input": [{"type": "function_call_output", "call_id": "call_x"}]}, "input[0].output"),
    ({"input": "x", "tools": [{"type": "web_search"}]}, "tools[0].type"),
    ({"input": "x", "tools": [{"type": "file_search", "vector_store_ids": []}]}, "tools[0].type"),
    ({"input": "x", "tools": [dict(TOOL, name="bad name")]}, "tools[0].name"),
    ({"input": "x", "tools": [TOOL, TOOL]}, "tools[1].name"),
    ({"input": "x", "tools": [dict(TOOL, parameters="x")]}, "tools[0].parameters"),
    ({"input": "x", "tools": [dict(TOOL, strict="yes")]}, "tools[0].strict"),
    ({"input": "x", "tools": {"type": "function"}}, "tools"),
    ({"input": "x", "tools": [TOOL], "tool_choice": {"type": "web_search_preview"}}, "tool_choice"),
    ({"input": "x", "tools": [TOOL], "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice.name"),
    ({"input": "x", "tool_choice": "required"}, "tool_choice"),
    ({"input": "x", "tools": [TOOL], "tool_choice": "sometimes"}, "tool_choice"),
    ({"input": "x", "text": {"format": {"type": "json_schema", "schema": {}}}}, "text.format.name"),
    ({"input": "x", "text": {"format": {"type": "json_schema", "name": "n"}}}, "text.format.schema"),
    ({"input": "x", "text": {"format": {"type": "json_schema", "name": "a b", "schema": {}}}}, "text.format.name"),
    ({"input": "x", "text": {"format": {"type": "grammar"}}}, "text.format.type"),
    ({"input": "x", "text": {"format": {"type": "text"}, "other": 1}}, "text.other"),
    ({"input": "x", "text": "json"}, "text"),
    ({"input": "x", "max_output_tokens": 0}, "max_output_tokens"),
    ({"input": "x", "temperature": 5}, "temperature"),
    ({"input": "x", "top_p": 0}, "top_p"),
    ({"input": "x", "seed": -1}, "seed"),
    ({"input": "x", "parallel_tool_calls": "yes"}, "parallel_tool_calls"),
    ({"input": "x", "include": ["reasoning.encrypted_content"]}, "include"),
    ({"input": "x", "include": "x"}, "include"),
    ({"input": "x", "reasoning": "high"}, "reasoning"),
    ({"input": "x", "truncation": "sometimes"}, "truncation"),
    ({"input": "x", "background": True}, "background"),
    ({"input": "x", "service_tier": "flex"}, "service_tier"),
    ({"input": "x", "top_logprobs": 3}, "top_logprobs"),
    ({"input": "x", "max_tool_calls": 2}, "max_tool_calls"),
    ({"input": "x", "store": "yes"}, "store"),
    ({"input": "x", "stream": "yes"}, "stream"),
    ({"input": "x", "stream_options": {"include_obfuscation": False}}, "stream_options"),
    ({"input": "x", "stream": True, "stream_options": {"include_usage": True}}, "stream_options"),
    ({"input": "x", "metadata": {"k": 1}}, "metadata"),
    ({"input": "x", "instructions": ["a"]}, "instructions"),
    ({"input": "x", "model": 3}, "model"),
    ({"input": "x", "previous_response_id": 3}, "previous_response_id"),
])
def test_refusals_name_the_field(body, param):
    e = refused(param, **body)
    if param in ("stop", "messages"):
        assert e.code == "unrecognized_argument"


def test_unknown_previous_response_is_404():
    e = refused("previous_response_id", 404, input="x", previous_response_id="resp_nope")
    assert e.code == "previous_response_not_found" and "resp_nope" in e.message


def test_body_must_be_an_object():
    with pytest.raises(APIError) as e:
        parse_responses(["input"], MODEL, ResponseMemory())
    assert e.value.status == 400


def test_later_errors_are_renamed():
    _, ctx = parse(input="x", text={"format": {"type": "json_object"}})
    e = ctx.renamed(APIError(400, "'response_format': bad schema", param="response_format"))
    assert (e.param, e.message) == ("text.format", "'text.format': bad schema")
    assert ctx.renamed(APIError(400, "'max_tokens' too big", param="max_tokens")).param == "max_output_tokens"
    assert ctx.renamed(APIError(400, "no param")).param is None


# ---------------------------------------------------------------------------------- the Response object
def test_response_object_validates():
    _, ctx = parse(input="x", instructions="sys", tools=[TOOL], metadata={"a": "b"}, max_output_tokens=50)
    body = response_object(ctx, MODEL, "Hello.", [], 5, 2, ext={"accepted": 1})
    r = Response.model_validate(body)
    assert (r.id, r.object, r.status, r.model, r.output_text) == (ctx.id, "response", "completed", MODEL, "Hello.")
    assert (r.usage.input_tokens, r.usage.output_tokens, r.usage.total_tokens) == (5, 2, 7)
    assert r.instructions == "sys" and r.max_output_tokens == 50 and r.metadata == {"a": "b"}
    assert r.tools[0].name == "get_weather" and r.tool_choice == "auto" and r.text.format.type == "text"
    assert body["edgespec"] == {"accepted": 1} and r.output[0].id.startswith("msg_")

    body = response_object(ctx, MODEL, None, [call("call_a"), call("call_b", args='{"city": "Rome"}')], 5, 20)
    r = Response.model_validate(body)
    assert [o.type for o in r.output] == ["function_call", "function_call"]
    assert [(o.call_id, o.name, json.loads(o.arguments)) for o in r.output] == \
        [("call_a", "get_weather", {"city": "Paris"}), ("call_b", "get_weather", {"city": "Rome"})]
    assert r.output[0].id != r.output[1].id and r.output_text == ""

    r = Response.model_validate(response_object(ctx, MODEL, "Let me see.", [call()], 1, 1))
    assert [o.type for o in r.output] == ["message", "function_call"]

    status, why = status_of("length")
    r = Response.model_validate(response_object(ctx, MODEL, "cut sho", [], 1, 50, status, why))
    assert (r.status, r.incomplete_details.reason, r.output[0].status) == \
        ("incomplete", "max_output_tokens", "incomplete")
    assert status_of("stop") == status_of("tool_calls") == ("completed", None)
    r = Response.model_validate(response_object(ctx, MODEL, None, [], 1, 0))
    assert r.output_text == "" and len(r.output) == 1


def test_response_object_of_a_parsed_answer():
    _, ctx = parse(input="x", tools=[TOOL])
    content, calls = parse_tool_calls(CALL_TEXT)
    r = Response.model_validate(response_object(ctx, MODEL, content, calls, 1, 1))
    assert [(o.type, o.name, json.loads(o.arguments)) for o in r.output] == [("function_call", "get_weather",
                                                                              {"city": "Paris"})]


# ---------------------------------------------------------------------------------- streaming
def run_stream(ctx, deltas, reason="stop", usage=(3, 4), ext=None):
    s = ResponseStream(ctx, MODEL)
    events = s.start()
    for d in deltas:
        events += s.feed(d)
    events += s.finish(reason, *usage, ext)
    return s, events


def accumulate(events, tools=(TOOL,)):
    """Every event validated with openai's types, then driven through its stream state."""
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    state = ResponseStreamState(input_tools=list(tools), text_format=openai.omit)
    for e in events:
        parsed = EVENT.validate_python(json.loads(json.dumps(e)))
        assert parsed.type == e["type"]
        state.handle_event(parsed)
    return state


def text_deltas(text, size=3):
    return [{"content": text[i:i + size]} for i in range(0, len(text), size)]


def call_deltas(text, size=5):
    tcs = ToolCallStream()
    out = []
    for i in range(0, len(text), size):
        out += tcs.feed(text[i:i + size])
    return out + tcs.finish()


def test_stream_of_text():
    _, ctx = parse(input="x")
    s, events = run_stream(ctx, text_deltas("Hello there, world."), ext={"k": 1})
    assert [e["type"] for e in events[:4]] == ["response.created", "response.in_progress",
                                               "response.output_item.added", "response.content_part.added"]
    assert [e["type"] for e in events[-4:]] == ["response.output_text.done", "response.content_part.done",
                                                "response.output_item.done", "response.completed"]
    state = accumulate(events)
    final = state._completed_response
    assert final is not None and final.output_text == "Hello there, world." and final.status == "completed"
    assert events[-1]["response"] == response_object(ctx, MODEL, "Hello there, world.", [], 3, 4, ext={"k": 1})
    assert (s.content, s.calls) == ("Hello there, world.", [])
    deltas = [e for e in events if e["type"] == "response.output_text.delta"]
    assert {(e["output_index"], e["content_index"], e["item_id"]) for e in deltas} == {(0, 0, f"msg_{ctx.hex}_0")}


def test_stream_of_calls_from_the_chat_deltas():
    _, ctx = parse(input="x", tools=[TOOL], parallel_tool_calls=True)
    second = CALL_TEXT.replace("Paris", "Rome")
    deltas = call_deltas(CALL_TEXT + "\n" + second)
    assert sum(1 for d in deltas for tc in d.get("tool_calls", ()) if "id" in tc) == 2
    s, events = run_stream(ctx, deltas, reason="tool_calls")
    state = accumulate(events, [dict(TOOL, strict=True)])      # strict: the client parses the arguments
    final = state._completed_response
    assert [(o.type, o.name, o.arguments, o.status) for o in final.output] == [
        ("function_call", "get_weather", '{"city": "Paris"}', "completed"),
        ("function_call", "get_weather", '{"city": "Rome"}', "completed")]
    assert [o.parsed_arguments for o in final.output] == [{"city": "Paris"}, {"city": "Rome"}]
    assert events[-1]["response"] == response_object(ctx, MODEL, None, s.calls, 3, 4)
    assert [c["function"]["arguments"] for c in s.calls] == ['{"city": "Paris"}', '{"city": "Rome"}']
    added = [e for e in events if e["type"] == "response.output_item.added"]
    assert [(e["output_index"], e["item"]["arguments"], e["item"]["status"]) for e in added] == \
        [(0, "", "in_progress"), (1, "", "in_progress")]
    args = [e for e in events if e["type"] == "response.function_call_arguments.delta"]
    assert {e["output_index"] for e in args} == {0, 1}
    assert "".join(e["delta"] for e in args if e["output_index"] == 1) == '{"city": "Rome"}'


def test_stream_of_text_then_a_call():
    _, ctx = parse(input="x", tools=[TOOL])
    deltas = text_deltas("Let me check.") + [
        {"tool_calls": [{"index": 0, "id": "call_q", "type": "function",
                         "function": {"name": "get_weather", "arguments": '{"city": '}}]},
        {"tool_calls": [{"index": 0, "function": {"arguments": '"Oslo"}'}}]}]
    s, events = run_stream(ctx, deltas, reason="tool_calls")
    final = accumulate(events)._completed_response
    assert final.output_text == "Let me check."
    assert [(o.type, getattr(o, "arguments", None)) for o in final.output] == [("message", None),
                                                                              ("function_call", '{"city": "Oslo"}')]
    assert events[-1]["response"] == response_object(ctx, MODEL, "Let me check.", s.calls, 3, 4)
    assert s.calls == [call("call_q", args='{"city": "Oslo"}')]


def test_stream_of_an_empty_answer_and_a_cut_one():
    _, ctx = parse(input="x")
    _, events = run_stream(ctx, [])
    assert accumulate(events)._completed_response.output_text == ""
    assert events[-1]["response"] == response_object(ctx, MODEL, None, [], 3, 4)
    _, events = run_stream(ctx, text_deltas("cut sh"), reason="length")
    accumulate(events)
    assert events[-1]["type"] == "response.incomplete"
    r = Response.model_validate(events[-1]["response"])
    assert (r.status, r.incomplete_details.reason, r.output[0].status, r.output_text) == \
        ("incomplete", "max_output_tokens", "incomplete", "cut sh")
    assert events[-1]["response"] == response_object(ctx, MODEL, "cut sh", [], 3, 4, *status_of("length"))


def test_stream_error_is_an_error_event_then_failed():
    _, ctx = parse(input="x")
    s = ResponseStream(ctx, MODEL)
    events = s.start() + s.feed({"content": "part"}) + s.error("the worker stopped")
    assert [e["type"] for e in events[-2:]] == ["error", "response.failed"]
    accumulate(events)
    r = Response.model_validate(events[-1]["response"])
    assert (r.status, r.error.code, r.error.message, r.output[0].status) == \
        ("failed", "server_error", "the worker stopped", "incomplete")
    assert s.error("again") == []
    with pytest.raises(ValueError):
        s.feed({"content": "more"})


def test_stream_refuses_arguments_of_no_call():
    _, ctx = parse(input="x")
    s = ResponseStream(ctx, MODEL)
    s.start()
    with pytest.raises(ValueError):
        s.feed({"tool_calls": [{"index": 0, "function": {"arguments": "{}"}}]})


def test_sse_format():
    _, ctx = parse(input="x")
    event = ResponseStream(ctx, MODEL).start()[0]
    text = sse(event)
    assert text.startswith("event: response.created\ndata: ") and text.endswith("\n\n")
    assert json.loads(text.split("data: ", 1)[1]) == event and text.count("\n") == 3


def test_the_openai_client_reads_them():
    """client.responses.create and client.responses.stream over a mock transport serving these bodies."""
    _, ctx = parse(input="x", tools=[TOOL])
    _, events = run_stream(ctx, text_deltas("Checking.") + call_deltas(CALL_TEXT), reason="tool_calls")
    whole = response_object(ctx, MODEL, "Done.", [], 2, 3)
    probe = openai.OpenAI(api_key="k", base_url="http://edgespec.test/v1")
    base = next(c for c in type(probe._client).__mro__ if not c.__module__.startswith("openai"))
    hx = __import__(base.__module__.split(".")[0])       # httpx, or the httpx2 newer clients use
    seen = []

    def handler(request):
        body = json.loads(request.content)
        seen.append(body)
        if body.get("stream"):
            return hx.Response(200, headers={"content-type": "text/event-stream"},
                               content="".join(sse(e) for e in events).encode())
        return hx.Response(200, json=whole)

    client = openai.OpenAI(api_key="k", base_url="http://edgespec.test/v1", max_retries=0,
                           http_client=hx.Client(transport=hx.MockTransport(handler)))
    assert client.responses.create(model=MODEL, input="x").output_text == "Done."
    with client.responses.stream(model=MODEL, input="x", tools=[TOOL]) as stream:
        kinds = [e.type for e in stream]
        final = stream.get_final_response()
    assert kinds == [e["type"] for e in events]
    assert final.output_text == "Checking."
    fc = [o for o in final.output if o.type == "function_call"]
    assert [(o.name, json.loads(o.arguments)) for o in fc] == [("get_weather", {"city": "Paris"})]
    assert seen[0]["input"] == "x" and seen[1]["stream"] is True


# ---------------------------------------------------------------------------------- memory
def test_memory_is_bounded_in_entries_and_characters():
    memory = ResponseMemory(max_entries=3, max_chars=2000)
    ctxs = [parse(memory, input=f"message {i}")[1] for i in range(5)]
    for c in ctxs:
        memory.remember(c, "ok", [])
    assert len(memory) == 3 and memory.get(ctxs[0].id) is None and memory.get(ctxs[4].id) is not None
    assert memory.get(ctxs[2].id) is not None          # used: now the newest
    memory.remember(parse(memory, input="another")[1], "ok", [])
    assert memory.get(ctxs[3].id) is None and memory.get(ctxs[2].id) is not None

    big = [parse(memory, input="y" * 600)[1] for _ in range(4)]
    for c in big:
        assert memory.remember(c, "ok", [])
    assert memory.chars <= 2000 and len(memory) <= 3
    assert memory.get(big[0].id) is None and memory.get(big[-1].id) is not None
    huge = parse(memory, input="z" * 3000)[1]
    assert not memory.remember(huge, "ok", []) and memory.get(huge.id) is None
    assert memory.chars == sum(len(json.dumps(memory.get(k), ensure_ascii=False)) for k in list(memory._items))


def test_memory_returns_copies_in_chat_shape():
    memory = ResponseMemory()
    _, ctx = parse(memory, input="hi")
    memory.remember(ctx, None, [call("call_d", args={"city": "Oslo"})])
    got = memory.get(ctx.id)
    assert got[-1] == {"role": "assistant", "content": "", "tool_calls": [call("call_d", args='{"city": "Oslo"}')]}
    got.append({"role": "user", "content": "changed"})
    assert len(memory.get(ctx.id)) == 2
    assert protocol.parse_chat({"model": MODEL, "messages": memory.get(ctx.id)}, MODEL).prompt[-1]["tool_calls"]
