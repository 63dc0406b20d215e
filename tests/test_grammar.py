"""Constrained decoding (runtime/samplers/grammar.py, docs/structured-output.md) on the tiny bundles: the output
obeys the grammar; greedy speculative output equals greedy constrained `ar` token for token for every
strategy (same, self and heterogeneous pairs, with and without the grammar's forced tokens as drafts);
bad constraints are one-line errors before any model runs."""
import json
import re

import numpy as np
import pytest

from edgespec.errors import GenerationError
from edgespec.runtime import Bundle, SpeculativeDecoder
from edgespec.runtime.samplers.grammar import TOOL_CALL_JSON
from test_rdk import bundle_with_priors  # tests/ is on sys.path (conftest.py)

pytest.importorskip("llguidance")

PROMPTS = ["The quick brown fox", "def quicksort(items):\n    "]
N = 40
SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 6},
    "kind": {"enum": ["fox", "dog", "cat"]},
    "legs": {"type": "integer", "minimum": 0, "maximum": 8},
    "tags": {"type": "array", "items": {"type": "boolean"}, "maxItems": 2}},
    "required": ["name", "kind", "legs"]}
CONSTRAINTS = {
    "schema": dict(json_schema=SCHEMA),
    "object": dict(response_format={"type": "json_object"}),
    "regex": dict(regex=r"(yes|no), [a-z]{2,5}\.( [0-9]{1,3})?"),
    "lark": dict(grammar='start: "x=" NUM (", " NUM)* ";"\nNUM: /[0-9]{1,2}/\n'),
}
STRATEGIES = {"same": ["tli", "sd", "ngram", "ngram-tli", "auto", "rdk-taylor", "rdk"],
              "self": ["tli", "ngram-tli", "auto", "rdk-taylor"],
              "hetero": ["tli", "slem", "slrs1", "auto", "rdk-taylor", "rdk"]}


@pytest.fixture(scope="module")
def bundles(tiny_same_bundle, tiny_self_bundle, tiny_hetero_bundle):
    return {name: bundle_with_priors(path) for name, path in
            (("same", tiny_same_bundle), ("self", tiny_self_bundle), ("hetero", tiny_hetero_bundle))}


@pytest.fixture(scope="module")
def references(bundles):
    """Greedy constrained `ar`, without forced drafts: the reference every strategy must reproduce."""
    out = {}
    for name, b in bundles.items():
        dec = SpeculativeDecoder(b, strategy="ar", threads=1)
        for c, kw in CONSTRAINTS.items():
            out[name, c] = [dec.generate(p, max_new_tokens=N, jump_forward=False, **kw) for p in PROMPTS]
    return out


def _valid_prefix(kind: str, text: str, complete: bool) -> None:
    if kind == "regex":
        assert not complete or re.fullmatch(CONSTRAINTS["regex"]["regex"], text), text
    elif kind == "lark":
        assert re.fullmatch(r"x=[0-9]{1,2}(, [0-9]{1,2})*;" if complete else r"(x(=([0-9]{1,2}(, ?([0-9]{1,2})?)*;?)?)?)?", text), text
    elif complete:
        value = json.loads(text)
        assert isinstance(value, dict)
        if kind == "schema":
            assert value["kind"] in ("fox", "dog", "cat") and 0 <= value["legs"] <= 8 and len(value["name"]) <= 6


def test_reference_outputs_obey_the_grammar(references):
    complete = 0
    for (name, kind), results in references.items():
        for r in results:
            assert r.finish_reason == ("stop" if r.stats.stop_reason == "eos" else "length")
            _valid_prefix(kind, r.text, r.finish_reason == "stop")
            complete += r.finish_reason == "stop"
    assert complete >= len(references)      # most tiny-model outputs end within N tokens


@pytest.mark.parametrize("name", ["same", "self", "hetero"])
@pytest.mark.parametrize("k", [1, 4])
def test_greedy_speculative_equals_constrained_ar(bundles, references, name, k):
    for strategy in STRATEGIES[name]:
        dec = SpeculativeDecoder(bundles[name], strategy=strategy, draft_length=k, threads=1)
        for c, kw in CONSTRAINTS.items():
            for jump in (True, False):
                for p, ref in zip(PROMPTS, references[name, c]):
                    r = dec.generate(p, max_new_tokens=N, jump_forward=jump, **kw)
                    assert r.token_ids == ref.token_ids, (strategy, k, c, jump, p)
                    assert r.text == ref.text and r.finish_reason == ref.finish_reason
                    if not jump:
                        assert r.stats.forced == 0


@pytest.mark.parametrize("kwargs,match", [
    (dict(json_schema={"type": "object", "properties": {"a": {"type": "strin"}}}), "json schema"),
    (dict(json_schema="{not json"), "json_schema is not valid JSON"),
    (dict(json_schema=[1, 2]), "json_schema must be a JSON object"),
    (dict(json_schema={"type": "string", "pattern": "[a-"}), "json schema"),
    (dict(regex="[a-"), "regex is not supported or invalid"),
    (dict(regex=5), "regex must be a string"),
    (dict(grammar="start: foo"), "grammar is not supported or invalid"),
    (dict(grammar=""), "grammar must be a non-empty"),
    (dict(response_format={"type": "xml"}), "response_format.type must be one of"),
    (dict(response_format="json"), "response_format must be an object"),
    (dict(response_format={"type": "json_schema"}), "response_format.json_schema.schema is missing"),
    (dict(regex="a", grammar='start: "a"'), "give one of"),
])
def test_bad_constraints_are_one_line_errors_before_any_model_runs(bundles, kwargs, match):
    dec = SpeculativeDecoder(bundles["same"], strategy="tli", threads=1)
    before = dec.shared.generation
    with pytest.raises(GenerationError, match=match) as e:
        dec.generate("hello", max_new_tokens=4, **kwargs)
    assert "\n" not in str(e.value)
    with pytest.raises(GenerationError, match=match):
        dec.stream("hello", max_new_tokens=4, **kwargs)          # checked at the call, not at the first next()
    assert dec.shared.generation == before                           # no generation started


def test_without_llguidance_the_error_names_the_extra(bundles, monkeypatch):
    import sys
    monkeypatch.setitem(sys.modules, "llguidance", None)        # `import llguidance` raises ImportError
    dec = SpeculativeDecoder(bundles["same"], strategy="ar", threads=1)
    with pytest.raises(GenerationError, match=r"pip install 'edgespec\[serve\]' \(or 'edgespec\[grammar\]'"):
        dec.generate("hello", max_new_tokens=4, regex="a+")
    assert dec.generate("hello", max_new_tokens=4).stats.new_tokens == 4      # unconstrained still works


def test_a_grammar_that_cannot_end_in_time_says_length(bundles):
    dec = SpeculativeDecoder(bundles["self"], strategy="tli", draft_length=4, threads=1)
    schema = {"type": "array", "items": {"type": "integer"}, "minItems": 40}
    r = dec.generate(PROMPTS[0], max_new_tokens=12, json_schema=schema)
    assert r.finish_reason == "length" and r.stats.stop_reason == "length" and len(r.token_ids) == 12
    with pytest.raises(ValueError):
        json.loads(r.text)
    assert re.fullmatch(r"\[\s*(-?[0-9]+\s*(,\s*)?)*", r.text), r.text    # a valid prefix, not a complete answer


@pytest.mark.parametrize("name", ["self", "hetero"])
def test_stream_concatenates_to_the_constrained_text(bundles, references, name):
    dec = SpeculativeDecoder(bundles[name], strategy="auto", draft_length=4, threads=1)
    for c, kw in CONSTRAINTS.items():
        text = "".join(dec.stream(PROMPTS[0], max_new_tokens=N, **kw))
        assert text == references[name, c][0].text == dec.last_result.text
        assert dec.last_result.token_ids == references[name, c][0].token_ids


def test_sampled_outputs_obey_the_grammar(bundles):
    dec = SpeculativeDecoder(bundles["same"], strategy="tli", draft_length=4, threads=1)
    for seed in range(6):
        for c, kw in CONSTRAINTS.items():
            r = dec.generate(PROMPTS[1], max_new_tokens=N, temperature=1.0, top_k=50, seed=seed, **kw)
            _valid_prefix(c, r.text, r.finish_reason == "stop")


def test_forced_tokens_are_free_drafts(bundles):
    """A schema whose keys and punctuation are forced: with jump_forward they are drafted without a
    drafter forward and all kept; fewer target forwards for the same tokens."""
    dec = SpeculativeDecoder(bundles["same"], strategy="tli", draft_length=1, threads=1)
    one_line = {**SCHEMA, "x-guidance": TOOL_CALL_JSON}     # no whitespace choices: more is forced
    on = dec.generate(PROMPTS[0], max_new_tokens=N, json_schema=one_line)
    off = dec.generate(PROMPTS[0], max_new_tokens=N, json_schema=one_line, jump_forward=False)
    assert on.token_ids == off.token_ids
    st = on.stats
    assert st.forced >= 8 and st.forced_accepted == st.forced and st.forced_rounds >= 2
    assert st.verify_forwards < off.stats.verify_forwards
    assert off.stats.forced == 0 and st.grammar_masks > 0 and st.grammar_ms > 0


def test_prefix_reuse_across_constrained_chat_turns(bundles):
    dec = SpeculativeDecoder(bundles["self"], strategy="auto", draft_length=4, threads=1)
    turn = [{"role": "user", "content": "Give me a JSON object."}]
    first = dec.generate(turn, max_new_tokens=N, chat=True, **CONSTRAINTS["schema"])
    turn += [{"role": "assistant", "content": first.text}, {"role": "user", "content": "Another one."}]
    second = dec.generate(turn, max_new_tokens=N, chat=True, **CONSTRAINTS["schema"])
    assert second.stats.reused_tokens >= first.stats.prompt_tokens
    cold = SpeculativeDecoder(bundles["self"], strategy="auto", draft_length=4, threads=1, prefix_reuse=False)
    assert cold.generate(turn, max_new_tokens=N, chat=True, **CONSTRAINTS["schema"]).token_ids == second.token_ids
