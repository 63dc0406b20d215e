"""Tool loops that finish through `edgespec serve`, with the real openai client (serve/tools.py,
serve/calls.py):
- on a tiny bundle given a chat template that takes tools (random weights: the grammar decides the shape):
  without `parallel_tool_calls` one call, streamed or not; with it, at most MAX_CALLS distinct calls;
  an answer cut by max_tokens says "length" and carries only complete calls; a malformed tool call or
  tool result in the history is a 400 naming the field;
- on the real SmolLM2 (smollm-self, with the same template): an agent loop with the client's defaults
  (several tools, tool results fed back, streamed and not) that ends in a text answer."""
from __future__ import annotations

import json

import openai
import pytest

from edgespec.serve.tools import MAX_CALLS
from test_serve import Server, bundle_path  # tests/ is on sys.path (conftest.py)
from test_serve_structured import QWEN_TEMPLATE, TOOLS, with_template

pytest.importorskip("llguidance")

ASK = [{"role": "user", "content": "What is the weather in Paris, and what is 2 plus 3?"}]


# ChatML that names the tools (the tiny model's context, 512 tokens, is too short for Qwen2.5's template;
# the answer's grammar does not depend on the template)
TINY_TEMPLATE = ("{% if tools %}<|im_start|>system\ntools: {{ tools | map(attribute='function') | map(attribute='name')"
                 " | join(', ') }}<|im_end|>\n{% endif %}{% for m in messages %}<|im_start|>{{ m.role }}\n"
                 "{{ m.content or '' }}{% for c in m.tool_calls or [] %}<tool_call>{{ c.function.name }}</tool_call>"
                 "{% endfor %}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@pytest.fixture(scope="module")
def tiny_server(tiny_same_bundle, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("agent")
    (tmp / "template.jinja").write_text(TINY_TEMPLATE)
    path = with_template(tiny_same_bundle, tmp / "template.jinja", tmp / "tiny-tools")
    srv = Server(path, "--max-tokens-cap", "160", "--model-name", "tiny")
    yield srv
    assert srv.stop() == 0, "".join(srv.lines)


def _create(client, **kw):
    return client.chat.completions.create(**dict(dict(model="tiny", messages=ASK, tools=TOOLS, temperature=0,
                                                      max_tokens=160), **kw))


def _streamed(client, **kw):
    """(content, [(name, arguments)], finish_reason) assembled from a stream."""
    calls, content, finish = {}, "", None
    for chunk in _create(client, stream=True, **kw):
        c = chunk.choices[0]
        finish = c.finish_reason or finish
        content += c.delta.content or ""
        for d in c.delta.tool_calls or []:
            slot = calls.setdefault(d.index, ["", ""])
            slot[0] += (d.function.name or "") if d.function else ""
            slot[1] += (d.function.arguments or "") if d.function else ""
    return content, [tuple(v) for _, v in sorted(calls.items())], finish


def _pairs(message):
    return [(c.function.name, c.function.arguments) for c in message.tool_calls or []]


def test_one_call_unless_parallel_calls_are_asked_for(tiny_server):
    client = tiny_server.client()
    got = _create(client, tool_choice="required")
    choice = choice_ = got.choices[0]
    assert choice.finish_reason == "tool_calls" and len(choice.message.tool_calls) == 1, choice
    assert json.loads(choice.message.tool_calls[0].function.arguments) is not None
    content, calls, finish = _streamed(client, tool_choice="required")
    assert calls == _pairs(choice_.message) and finish == "tool_calls" and not content
    assert _create(client, tool_choice="required", parallel_tool_calls=False).choices[0].message.tool_calls[0] \
        .function.arguments == choice.message.tool_calls[0].function.arguments


def test_parallel_calls_are_distinct_and_bounded(tiny_server):
    client = tiny_server.client()
    got = _create(client, tool_choice="required", parallel_tool_calls=True, max_tokens=160)
    pairs = _pairs(got.choices[0].message)
    assert 1 <= len(pairs) <= MAX_CALLS
    keys = [(n, json.dumps(json.loads(a), sort_keys=True)) for n, a in pairs]
    assert len(set(keys)) == len(keys)                  # a repeated call ends the answer before it
    assert got.choices[0].finish_reason in ("tool_calls", "length")
    _, calls, finish = _streamed(client, tool_choice="required", parallel_tool_calls=True, max_tokens=160)
    assert calls == pairs and finish == got.choices[0].finish_reason


@pytest.mark.parametrize("parallel", [False, True])
def test_an_answer_cut_by_max_tokens_says_length_and_has_only_complete_calls(tiny_server, parallel):
    client = tiny_server.client()
    whole = _create(client, tool_choice="required", parallel_tool_calls=parallel)
    n = whole.usage.completion_tokens
    seen_cut = 0
    for max_tokens in (3, n // 2, n - 2, n + 4):
        got = _create(client, tool_choice="required", parallel_tool_calls=parallel, max_tokens=max_tokens)
        choice = got.choices[0]
        if choice.finish_reason == "length":
            seen_cut += 1
            assert "<tool_call>" not in (choice.message.content or "")      # no half-written call, as text either
            for _, args in _pairs(choice.message):
                json.loads(args)                                          # complete calls only
        else:
            assert choice.finish_reason == "tool_calls"
        content, calls, finish = _streamed(client, tool_choice="required", parallel_tool_calls=parallel,
                                           max_tokens=max_tokens)
        assert (calls, finish) == (_pairs(choice.message), choice.finish_reason) and "<tool_call>" not in content
    assert seen_cut >= 2


CALL = {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}


def _history(call=None, result=None):
    call = dict(CALL, **(call or {}))
    return ASK + [{"role": "assistant", "content": None, "tool_calls": [call]},
                  dict({"role": "tool", "tool_call_id": "call_1", "content": "5"}, **(result or {}))]


@pytest.mark.parametrize("messages,param,says", [
    (_history(call={"id": None}), "messages[1].tool_calls[0].id", "is required"),
    (_history(call={"id": ""}), "messages[1].tool_calls[0].id", "is required"),
    (_history(call={"function": {"arguments": "{}"}}), "messages[1].tool_calls[0].function.name", "is required"),
    (_history(call={"function": {"name": "add", "arguments": "{'a': 2"}}),
     "messages[1].tool_calls[0].function.arguments", "not valid JSON"),
    (_history(call={"function": {"name": "add", "arguments": "[1, 2]"}}),
     "messages[1].tool_calls[0].function.arguments", "must be a JSON object"),
    (_history(call={"type": "web"}), "messages[1].tool_calls[0]", "must be"),
    (_history(result={"tool_call_id": None}), "messages[2].tool_call_id", "is required"),
    (_history(result={"tool_call_id": "call_9"}), "messages[2].tool_call_id", "answers no tool call"),
    (_history(result={"content": None}), "messages[2].content", "must be a string"),
    (_history(result={"content": {"temp": 21}}), "messages[2].content", "must be a string"),
    (_history(result={"content": [{"type": "image_url", "image_url": {"url": "x"}}]}), "messages[2].content",
     "text part"),
    (ASK + [{"role": "assistant", "content": None, "tool_calls": "add"}], "messages[1].tool_calls",
     "non-empty array"),
])
def test_a_malformed_tool_history_is_a_400_naming_the_field(tiny_server, messages, param, says):
    client = tiny_server.client()
    with pytest.raises(openai.BadRequestError) as e:
        _create(client, messages=messages, max_tokens=4)
    body = e.value.body
    assert body["param"] == param and says in body["message"] and "\n" not in body["message"], body
    assert _create(client, messages=_history(), max_tokens=2, tool_choice="none").choices     # well-formed: served


def test_a_message_sent_back_as_received_is_accepted(tiny_server):
    """An agent appends the assistant message object it got (with `refusal: null` and the like)."""
    client = tiny_server.client()
    got = _create(client, tool_choice="required")
    msg = got.choices[0].message
    history = ASK + [msg, {"role": "tool", "tool_call_id": msg.tool_calls[0].id, "content": "21 C"}]
    assert _create(client, messages=history, max_tokens=4, tool_choice="none").choices[0].message.content is not None


# ------------------------------------------------------------------------------------- the real model
def _run_tool(name: str, args: dict) -> str:
    if name == "add":
        return json.dumps({"sum": args.get("a", 0) + args.get("b", 0)})
    return json.dumps({"city": args.get("city"), "temperature": 21, "unit": args.get("unit", "celsius")})


@pytest.mark.real
@pytest.mark.parametrize("stream", [False, True])
def test_an_agent_loop_with_the_client_defaults_finishes(request, tmp_path_factory, stream):
    """The loop an agent runs: ask with the tools (no tool_choice, no parallel_tool_calls: the client's
    defaults), run each call, feed the results back, until the answer is text. The first step requires a
    call (as agents do to start), later ones are left to the model; it must finish within 6 steps,
    every step a well-formed answer. (SmolLM2-135M calls the same tool again at every step: the server
    answers in text at the first call the conversation already made.)"""
    path = with_template(bundle_path(request), QWEN_TEMPLATE, tmp_path_factory.mktemp("loop") / "smollm-qwen")
    srv = Server(path, "--max-tokens-cap", "160", "--model-name", "smollm")
    try:
        client = srv.client()
        messages = [{"role": "system", "content": "You are a helpful assistant. Use the tools, then answer."},
                    {"role": "user", "content": "What is the weather in Paris? Then add 2 and 3."}]
        steps, called = 0, []
        for step in range(6):
            kw = dict(model="smollm", messages=messages, tools=TOOLS, temperature=0, max_tokens=160)
            if step == 0:
                kw["tool_choice"] = "required"
            if stream:
                content, calls, finish = "", {}, None
                for chunk in client.chat.completions.create(stream=True, **kw):
                    c = chunk.choices[0]
                    finish = c.finish_reason or finish
                    content += c.delta.content or ""
                    for d in c.delta.tool_calls or []:
                        slot = calls.setdefault(d.index, {"id": None, "name": "", "arguments": ""})
                        slot["id"] = d.id or slot["id"]
                        slot["name"] += (d.function.name or "") if d.function else ""
                        slot["arguments"] += (d.function.arguments or "") if d.function else ""
                tool_calls = [{"id": v["id"], "type": "function",
                               "function": {"name": v["name"], "arguments": v["arguments"]}}
                              for _, v in sorted(calls.items())]
                messages.append({"role": "assistant", "content": content or None, **({"tool_calls": tool_calls}
                                                                                     if tool_calls else {})})
            else:
                choice = client.chat.completions.create(**kw).choices[0]
                finish, content = choice.finish_reason, choice.message.content
                tool_calls = [c.model_dump() for c in choice.message.tool_calls or []]
                messages.append(choice.message)
            steps += 1
            if not tool_calls:                  # the answer (a 135M model may ramble to max_tokens)
                assert finish in ("stop", "length") and content and "<tool_call>" not in content, (finish, content)
                break
            assert finish == "tool_calls" and len(tool_calls) == 1, (finish, tool_calls)
            for call in tool_calls:
                f = call["function"]
                called.append(f["name"])
                messages.append({"role": "tool", "tool_call_id": call["id"],
                                 "content": _run_tool(f["name"], json.loads(f["arguments"]))})
        else:
            pytest.fail(f"the loop did not finish in 6 steps: {called}")
        assert called and steps >= 2
    finally:
        assert srv.stop() == 0, "".join(srv.lines)
