"""Request checking of the OpenAI-compatible server (edgespec.serve.protocol), no model needed:
every field the runtime cannot honour and every malformed one is a 4xx naming the field."""
from __future__ import annotations

import pytest

from edgespec.serve.protocol import APIError, parse_chat, parse_completion

MSGS = [{"role": "user", "content": "hi"}]


def chat(**kw):
    return parse_chat({"model": "m", "messages": MSGS, **kw}, "m")


def refused(fn, param, status=400, **kw):
    with pytest.raises(APIError) as e:
        fn(**kw)
    assert e.value.status == status and e.value.param == param, e.value.body()
    assert "\n" not in e.value.message
    body = e.value.body()["error"]
    assert set(body) == {"message", "type", "param", "code"}
    return e.value


def test_defaults_and_accepted_fields():
    r = chat()
    assert (r.kind, r.max_tokens, r.temperature, r.top_p, r.stop, r.stream) == ("chat", None, 1.0, None, [], False)
    r = chat(max_completion_tokens=7, temperature=0, top_p=0.9, top_k=5, seed=3, stop="\n", stream=True,
             stream_options={"include_usage": True}, n=1, logprobs=False, user="u", tools=[],
             response_format={"type": "text"}, presence_penalty=0)
    assert (r.max_tokens, r.temperature, r.top_p, r.top_k, r.seed, r.stop, r.include_usage) == \
        (7, 0.0, 0.9, 5, 3, ["\n"], True)
    r = parse_chat({"model": "m", "messages": [{"role": "developer", "content": [{"type": "text", "text": "a"},
                                                                                 {"type": "text", "text": "b"}]}]}, "m")
    assert r.prompt == [{"role": "system", "content": "ab"}]
    assert parse_completion({"model": "m", "prompt": ["one"]}, "m").prompt == "one"
    assert parse_completion({"model": "m", "prompt": [1, 2, 3]}, "m").prompt == [1, 2, 3]


@pytest.mark.parametrize("field,value", [("functions", [{"name": "f"}]), ("presence_penalty", 0.5),
                                         ("frequency_penalty", 1), ("logit_bias", {"1": 5}), ("audio", {}),
                                         ("store", True)])
def test_unsupported_fields_are_refused_by_name(field, value):
    err = refused(chat, field, **{field: value})
    assert err.code == "unsupported_parameter" and f"'{field}'" in err.message


@pytest.mark.parametrize("field,value", [("max_tokens", "5"), ("max_tokens", 0), ("max_tokens", -1),
                                         ("max_tokens", True), ("max_completion_tokens", 2.5), ("temperature", "0"),
                                         ("temperature", -0.1), ("temperature", float("nan")), ("top_p", 0),
                                         ("top_p", 1.5), ("top_k", -1), ("seed", -5), ("seed", "1"), ("stop", 3),
                                         ("stop", [""]), ("stop", ["a"] * 5), ("stop", {"a": 1}),
                                         ("stream", 1), ("user", 5), ("metadata", []), ("model", 3),
                                         ("whatever", 1), ("n", 0), ("n", "2"), ("logprobs", 1),
                                         ("top_logprobs", 21), ("n_predict", 0), ("n_predict", "5"),
                                         ("cache_prompt", "yes"), ("parse_special", 1), ("grammar", 5),
                                         ("grammar", "root ::= ("), ("json_schema", [])])
def test_wrong_types_and_values_name_the_field(field, value):
    err = refused(chat, field, **{field: value})
    assert field in err.message


def test_messages_and_prompts():
    refused(lambda: parse_chat({"model": "m"}, "m"), "messages")
    refused(lambda: parse_chat({"model": "m", "messages": []}, "m"), "messages")
    refused(lambda: parse_chat({"model": "m", "messages": {"role": "user"}}, "m"), "messages")
    refused(lambda: parse_chat({"model": "m", "messages": ["hi"]}, "m"), "messages[0]")
    refused(lambda: parse_chat({"model": "m", "messages": [{"role": "robot", "content": "x"}]}, "m"), "messages[0].role")
    refused(lambda: parse_chat({"model": "m", "messages": [{"role": "tool", "content": "x"}]}, "m"),
            "messages[0].tool_call_id")
    refused(lambda: parse_chat({"model": "m", "messages": [{"role": "user", "content": None}]}, "m"),
            "messages[0].content")
    refused(lambda: parse_chat({"model": "m", "messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "m"),
            "messages[0].content")
    refused(lambda: parse_chat({"model": "m", "messages": [{"role": "user", "content": "x", "name": 5}]}, "m"),
            "messages[0].name")
    refused(lambda: parse_chat({"model": "m", "messages": [{"role": "user", "content": "x", "weight": 1}]}, "m"),
            "messages[0].weight")
    refused(lambda: parse_chat([1], "m"), None)
    refused(lambda: parse_chat({"model": "other", "messages": MSGS}, "m", strict_model=True), "model", status=404)
    refused(lambda: parse_chat({"messages": MSGS}, "m", strict_model=True), "model")
    refused(lambda: chat(top_logprobs=2), "top_logprobs")
    refused(lambda: chat(json_schema={"type": "object"}, response_format={"type": "json_object"}), "response_format")
    refused(lambda: chat(json_schema={"type": "object"}, grammar='root ::= "a"'), "grammar")
    refused(lambda: parse_completion({"model": "m", "prompt": "x", "parse_special": True}, "m"), "parse_special")
    refused(lambda: parse_completion({"model": "m", "prompt": "x", "logprobs": True}, "m"), "logprobs")
    refused(lambda: chat(stream_options={"include_usage": True}), "stream_options")
    refused(lambda: chat(stream=True, stream_options={"include_usage": 1}), "stream_options")
    refused(lambda: chat(max_tokens=5, max_completion_tokens=6), "max_tokens")
    for prompt in (None, "", 5, [], ["a", ""], [1, "a"], [-1], [[1], []], [["a"]]):
        refused(lambda: parse_completion({"model": "m", "prompt": prompt}, "m"), "prompt")
    refused(lambda: parse_completion({"model": "m", "prompt": "x", "messages": MSGS}, "m"), "messages")
    refused(lambda: parse_completion({"model": "m", "prompt": "x", "max_completion_tokens": 3}, "m"),
            "max_completion_tokens")


@pytest.mark.parametrize("fields,param", [
    (dict(response_format={"type": "xml"}), "response_format.type"),
    (dict(response_format=["json"]), "response_format"),
    (dict(response_format={"type": "json_schema"}), "response_format.json_schema"),
    (dict(response_format={"type": "json_schema", "json_schema": {"name": "a b", "schema": {}}}),
     "response_format.json_schema.name"),
    (dict(response_format={"type": "json_schema", "json_schema": {"name": "a", "schema": []}}),
     "response_format.json_schema.schema"),
    (dict(tools={"type": "function"}), "tools"),
    (dict(tools=[{"type": "function"}]), "tools[0]"),
    (dict(tools=[{"type": "function", "function": {"name": "f", "parameters": "x"}}]), "tools[0].function.parameters"),
    (dict(tools=[{"type": "function", "function": {"name": "f"}}] * 2), "tools[1].function.name"),
    (dict(tool_choice="auto"), "tool_choice"),
    (dict(tools=[{"type": "function", "function": {"name": "f"}}], tool_choice="always"), "tool_choice"),
    (dict(tools=[{"type": "function", "function": {"name": "f"}}], parallel_tool_calls="yes"), "parallel_tool_calls"),
])
def test_structured_output_and_tool_fields_name_the_field(fields, param):
    refused(chat, param, **fields)


def test_structured_output_and_tool_fields_accepted():
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    r = chat(tools=tools, tool_choice={"type": "function", "function": {"name": "f"}}, parallel_tool_calls=False)
    assert (r.tool_choice, r.parallel_tool_calls, r.tools[0]["function"]["name"]) == ("f", False, "f")
    assert chat(tools=tools).tool_choice == "auto" and chat().tool_choice == "none"
    assert chat(response_format={"type": "json_object"}).response_format == {"response_format": {"type": "json_object"}}
    assert chat(response_format={"type": "json_schema", "json_schema": {"name": "a", "schema": {"type": "object"}}}
                ).response_format == {"json_schema": {"type": "object"}}
    msgs = MSGS + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "42"}]
    r = parse_chat({"model": "m", "messages": msgs}, "m")
    assert r.prompt[1]["tool_calls"][0]["function"]["arguments"] == {"x": 1} and r.prompt[1]["content"] == ""
    assert r.prompt[2] == {"role": "tool", "tool_call_id": "c1", "content": "42"}


def test_any_model_name_or_none_serves_the_bundle():
    """llama-server and Ollama serve the loaded model whatever the name: scripts send gpt-3.5-turbo or nothing."""
    for body in ({"messages": MSGS}, {"model": "gpt-3.5-turbo", "messages": MSGS}, {"model": "", "messages": MSGS}):
        assert parse_chat(body, "m").prompt == [{"role": "user", "content": "hi"}]
    assert parse_completion({"prompt": "x"}, "m").prompt == "x"


def test_llama_server_fields_are_honoured_or_reported():
    r = chat(n_predict=7, cache_prompt=True, repeat_penalty=1.0, mirostat=0, ignore_eos=False, samplers=["top_k"])
    assert r.max_tokens == 7 and r.not_applied == {}
    assert chat(n_predict=-1).max_tokens is None and chat(n_predict=3, max_tokens=5).max_tokens == 5
    r = chat(repeat_penalty=1.3, mirostat=2, ignore_eos=True, cache_prompt=False)
    assert set(r.not_applied) == {"repeat_penalty", "mirostat", "ignore_eos", "cache_prompt"}
    assert all(isinstance(v, str) and v for v in r.not_applied.values())
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    assert chat(json_schema=schema).response_format == {"json_schema": schema}
    assert parse_completion({"prompt": "x", "json_schema": schema}, "m").response_format == {"json_schema": schema}
    assert chat(response_format={"type": "json_object", "schema": schema}).response_format == {"json_schema": schema}
    assert chat(response_format={"type": "json_schema", "schema": schema}).response_format == {"json_schema": schema}
    assert chat(response_format={"type": "json_schema", "json_schema": {"schema": schema}}).response_format == \
        {"json_schema": schema}
    lark = chat(grammar='root ::= "yes" | "no"').response_format["grammar"]
    assert "yes" in lark and "no" in lark
    r = parse_chat({"messages": [{"role": "user", "content": "x", "name": "bob"},
                                 {"role": "assistant", "content": "y", "name": "helper"}]}, "m")
    assert [m["content"] for m in r.prompt] == ["x", "y"]


def test_n_and_logprobs_fields():
    assert (chat().n, chat().logprobs) == (1, None)
    assert chat(n=3).n == 3
    assert chat(logprobs=True).logprobs == 0 and chat(logprobs=True, top_logprobs=5).logprobs == 5
    assert chat(logprobs=False, top_logprobs=0).logprobs is None
    assert parse_completion({"prompt": "x", "logprobs": 3}, "m").logprobs == 3
    assert parse_completion({"prompt": "x", "logprobs": 0}, "m").logprobs == 0
    assert chat(parse_special=True).parse_special is True and chat().parse_special is False


def test_a_completions_batch_is_a_choice_per_prompt():
    r = parse_completion({"prompt": ["one", [1, 2], "three"]}, "m")
    assert r.batch == ["one", [1, 2], "three"] and r.prompt == "one"
    assert parse_completion({"prompt": ["one"]}, "m").batch is None
