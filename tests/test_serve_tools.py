"""serve/tools.py without a model: the tool-call grammar compiles for both marker kinds, streamed
tool-call deltas (fed in every split) assemble into what parse_tool_calls reads from the whole text,
and template detection."""
import json

import pytest

from edgespec.serve.tools import CallGuard, ToolCallStream, parse_tool_calls, template_takes_tools, tool_grammar

TWO_CALLS = ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "note": "a}\\n</b"}}\n</tool_call>\n'
             '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>')
TOOLS = [{"type": "function", "function": {"name": n, "parameters": {"type": "object"}}} for n in ("get_weather", "add")]


def _assemble(pieces):
    calls, content = {}, ""
    for d in pieces:
        content += d.get("content", "")
        for c in d.get("tool_calls", []):
            slot = calls.setdefault(c["index"], {"name": "", "arguments": ""})
            slot["name"] += c.get("function", {}).get("name", "")
            slot["arguments"] += c.get("function", {}).get("arguments", "")
    return content, [(c["name"], c["arguments"]) for _, c in sorted(calls.items())]


@pytest.mark.parametrize("step", [1, 2, 3, 7, 1000])
def test_streamed_deltas_assemble_into_the_parsed_calls(step):
    content, calls = parse_tool_calls(TWO_CALLS)
    assert content is None and [c["function"]["name"] for c in calls] == ["get_weather", "add"]
    assert json.loads(calls[0]["function"]["arguments"]) == {"city": "Paris", "note": "a}\n</b"}
    s = ToolCallStream()
    pieces = [d for i in range(0, len(TWO_CALLS), step) for d in s.feed(TWO_CALLS[i:i + step])] + s.finish()
    assert _assemble(pieces) == ("", [(c["function"]["name"], c["function"]["arguments"]) for c in calls])
    assert s.called


def test_text_answers_stream_as_content():
    s = ToolCallStream()
    pieces = s.feed("The weather") + s.feed(" is fine.") + s.finish()
    assert _assemble(pieces) == ("The weather is fine.", []) and not s.called
    assert parse_tool_calls("The weather is fine.") == ("The weather is fine.", [])


def test_tool_grammar_and_template_detection():
    pytest.importorskip("llguidance")
    import tinymodels  # tests/ is on sys.path (conftest.py); the tokenizers only, no models
    from edgespec.runtime.samplers.grammar import GrammarTokenizer, constraint_from
    tok = tinymodels.tiny_tokenizers()["bytelevel"]
    gt = GrammarTokenizer(tok, tok.get_vocab_size(), [tok.token_to_id("<|im_end|>")])
    for choice in ("auto", "required", "add"):
        g = tool_grammar(tok, TOOLS, choice)
        assert '"<tool_call>"' in g                       # no single <tool_call> token here: the literal text
        gt.check(constraint_from(grammar=g))
    assert tool_grammar(tok, TOOLS, "none") is None
    assert template_takes_tools("{% if tools %}{{ tools | tojson }}{% endif %}")
    assert not template_takes_tools("{% for m in messages %}{{ m.content }}{% endfor %}")


# ------------------------------------------------------------------------------------- CallGuard
CALL_A = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
CALL_B = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
CALL_A_AGAIN = '<tool_call>\n{"name": "add", "arguments": {"b": 3, "a": 2}}\n</tool_call>'   # same call, keys reordered


def _guard(text, parallel, step):
    g = CallGuard(parallel)
    out = ""
    for i in range(0, len(text), step):
        out += g.feed(text[i:i + step])
        if g.done:
            break
    return g, out + g.finish()


@pytest.mark.parametrize("step", [1, 3, 11, 1000])
def test_a_repeated_call_ends_the_answer_before_it(step):
    g, out = _guard("\n".join([CALL_A, CALL_B, CALL_A_AGAIN, CALL_B]), True, step)
    assert g.done and out == g.text and out.rstrip("\n") == CALL_A + "\n" + CALL_B
    assert [c["function"]["name"] for c in parse_tool_calls(out)[1]] == ["add", "get_weather"]


@pytest.mark.parametrize("step", [1, 4, 1000])
def test_a_half_written_call_is_never_released(step):
    cut = CALL_A + "\n" + CALL_B[:30]
    for parallel in (True, False):
        g, out = _guard(cut, parallel, step)
        assert not g.done and out == CALL_A + "\n"
        assert len(parse_tool_calls(out)[1]) == 1
    g, out = _guard(CALL_B[:-3], False, step)
    assert out == "" and parse_tool_calls(out) == ("", [])


def test_text_passes_the_guard_as_it_comes():
    g = CallGuard(False)
    assert g.feed("The answer") == "The answer" and g.feed(" is 5 <") == " is 5 " and g.feed("3.") == "<3."
    assert g.finish() == "" and g.text == "The answer is 5 <3."


def test_one_call_unless_parallel_in_the_grammar():
    import tinymodels  # the tokenizers only, no models
    tok = tinymodels.tiny_tokenizers()["bytelevel"]
    assert "\ncalls: call\n" in tool_grammar(tok, TOOLS, "required")            # the default: one call
    assert '\ncalls: call ("\\n" call)~0..7\n' in tool_grammar(tok, TOOLS, "required", parallel=True)
    assert "\ncalls: call\n" in tool_grammar(tok, TOOLS, "add", parallel=True)  # a named function: one call


def test_a_call_the_conversation_already_made_ends_the_answer():
    """tool_choice "auto": the server then answers in text (serve/worker.py), through the same guard."""
    from edgespec.serve.tools import made_calls
    history = [{"role": "assistant", "content": "", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "add", "arguments": {"a": 2, "b": 3}}}]}]
    g = CallGuard(False, made_calls(history))
    assert g.feed(CALL_B) == CALL_B and not g.done                    # a new call passes
    assert g.feed("\n" + CALL_A_AGAIN) == "" and g.done and g.repeated
    assert g.passthrough().feed("It is 5.") == "It is 5." and g.text == CALL_B + "It is 5."


LOOSE_TOOLS = [{"type": "function", "function": {"name": "read_file", "parameters": {
    "type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}},
    {"type": "function", "function": {"name": "run_tests", "parameters": {"type": "object", "properties": {}}}}]
FENCED = '```json\n{\n  "name": "read_file",\n  "arguments": {"path": "stats.py"}\n}\n```'


@pytest.mark.parametrize("answer,call", [
    (FENCED, ("read_file", {"path": "stats.py"})),
    ('\n{"name": "run_tests", "arguments": {}}\n', ("run_tests", {})),
    ('```\n{"name": "run_tests"}\n```', ("run_tests", {})),
    ('```json\n{"name": "rm_rf", "arguments": {}}\n```', None),                 # not an offered tool
    ('```json\n{"name": "read_file", "arguments": {}}\n```', None),             # a required argument missing
    ('{"name": "read_file", "arguments": {"path": "a.py"}, "why": 1}', None),  # more than a call
    ("Here is the call:\n" + FENCED, None),                                     # prose around it: text
    ('{"name": "run_tests", "arguments": {}', None),                            # cut: not JSON
])
@pytest.mark.parametrize("step", [1, 4, 1000])
def test_a_text_answer_that_is_one_call_in_json_becomes_it(answer, call, step):
    """Qwen2.5-Coder under tool_choice "auto" often writes its call as a ```json block instead of
    <tool_call>: an agent loop with the client's defaults then ended at its first step (2026-11-27)."""
    from edgespec.serve.tools import LooseCalls
    loose = LooseCalls(LOOSE_TOOLS)
    got = loose(answer)
    assert (got and (got["function"]["name"], json.loads(got["function"]["arguments"]))) == (call or None)
    s = ToolCallStream(loose)
    pieces = [d for i in range(0, len(answer), step) for d in s.feed(answer[i:i + step])] + s.finish()
    content, calls = _assemble(pieces)
    assert (content, [(n, json.loads(a)) for n, a in calls]) == (("", [call]) if call else (answer, []))
    assert s.called == bool(call)


def test_loose_calls_keep_to_their_shape():
    from edgespec.serve.tools import LooseCalls, made_calls
    s = ToolCallStream(LooseCalls(LOOSE_TOOLS))
    assert s.feed("The tests") == [{"content": "The tests"}]          # plain text streams at once
    assert LooseCalls.may_start("  ``") is None and LooseCalls.may_start("`x") is False
    made = made_calls([{"role": "assistant", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "run_tests", "arguments": {}}}]}])
    assert LooseCalls(LOOSE_TOOLS, made)('{"name": "run_tests", "arguments": {}}') is None   # already made: text
    assert ToolCallStream().feed(FENCED) == [{"content": FENCED}]    # no LooseCalls (not "auto"): text as before


def test_a_call_in_the_history_renders_as_the_model_wrote_it():
    """An agent sends each call back in the history: rendered as generated, the server keeps the KV of the
    whole conversation (runtime/engine/prefix.py) and the model sees its own code unescaped."""
    from pathlib import Path

    from edgespec.runtime.bundle.chat import render_chat
    template = (Path(__file__).parent / "data" / "qwen2.5_chat_template.jinja").read_text()
    args = {"path": "a.py", "content": "if x < 'a' & y:\n    pass\n"}     # not in sorted order, <, &, '
    history = [{"role": "user", "content": "edit"}, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "write_file", "arguments": args}}]}]
    written = '<tool_call>\n{"name": "write_file", "arguments": ' + json.dumps(args, ensure_ascii=False) + \
        '}\n</tool_call>'
    assert written in render_chat(template, history, tools=LOOSE_TOOLS)
