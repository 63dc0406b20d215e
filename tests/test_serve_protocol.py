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


@pytest.mark.parametrize("field,value", [("n", 2), ("logprobs", True), ("top_logprobs", 3),
                                         ("tools", [{"type": "function"}]), ("tool_choice", "auto"),
                                         ("response_format", {"type": "json_object"}), ("presence_penalty", 0.5),
                                         ("frequency_penalty", 1), ("logit_bias", {"1": 5}), ("audio", {}),
                                         ("store", True), ("parallel_tool_calls", True)])
def test_unsupported_fields_are_refused_by_name(field, value):
    err = refused(chat, field, **{field: value})
    assert err.code == "unsupported_parameter" and f"'{field}'" in err.message


@pytest.mark.parametrize("field,value", [("max_tokens", "5"), ("max_tokens", 0), ("max_tokens", -1),
                                         ("max_tokens", True), ("max_completion_tokens", 2.5), ("temperature", "0"),
                                         ("temperature", -0.1), ("temperature", float("nan")), ("top_p", 0),
                                         ("top_p", 1.5), ("top_k", -1), ("seed", -5), ("seed", "1"), ("stop", 3),
                                         ("stop", [""]), ("stop", ["a"] * 5), ("stop", {"a": 1}),
                                         ("stream", 1), ("user", 5), ("metadata", []), ("model", 3),
                                         ("whatever", 1)])
def test_wrong_types_and_values_name_the_field(field, value):
    err = refused(chat, field, **{field: value})
    assert field in err.message


def test_messages_and_prompts():
    refused(lambda: parse_chat({"model": "m"}, "m"), "messages")
    refused(lambda: parse_chat({"model": "m", "messages": []}, "m"), "messages")
    refused(lambda: parse_chat({"model": "m", "messages": {"role": "user"}}, "m"), "messages")
    refused(lambda: parse_chat({"model": "m", "messages": ["hi"]}, "m"), "messages[0]")
    refused(lambda: parse_chat({"model": "m", "messages": [{"role": "robot", "content": "x"}]}, "m"), "messages[0].role")
    refused(lambda: parse_chat({"model": "m", "messages": [{"role": "tool", "content": "x"}]}, "m"), "messages[0].role")
    refused(lambda: parse_chat({"model": "m", "messages": [{"role": "user", "content": None}]}, "m"),
            "messages[0].content")
    refused(lambda: parse_chat({"model": "m", "messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "m"),
            "messages[0].content")
    refused(lambda: parse_chat({"model": "m", "messages": [{"role": "user", "content": "x", "name": "bob"}]}, "m"),
            "messages[0].name")
    refused(lambda: parse_chat([1], "m"), None)
    refused(lambda: parse_chat({"model": "other", "messages": MSGS}, "m"), "model", status=404)
    refused(lambda: parse_chat({"messages": MSGS}, "m"), "model")
    refused(lambda: chat(stream_options={"include_usage": True}), "stream_options")
    refused(lambda: chat(stream=True, stream_options={"include_usage": 1}), "stream_options")
    refused(lambda: chat(max_tokens=5, max_completion_tokens=6), "max_tokens")
    for prompt in (None, "", 5, [], ["a", "b"], [1, "a"], [-1], [[1], [2]]):
        refused(lambda: parse_completion({"model": "m", "prompt": prompt}, "m"), "prompt")
    refused(lambda: parse_completion({"model": "m", "prompt": "x", "messages": MSGS}, "m"), "messages")
    refused(lambda: parse_completion({"model": "m", "prompt": "x", "max_completion_tokens": 3}, "m"),
            "max_completion_tokens")
