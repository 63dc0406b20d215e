"""Constrained decoding (runtime/grammar.py, docs/structured-output.md) on the tiny bundles: the output
obeys the grammar; greedy speculative output equals greedy constrained `ar` token for token for every
strategy (same, self and heterogeneous pairs, with and without the grammar's forced tokens as drafts);
bad constraints are one-line errors before any model runs."""
import json
import re

import numpy as np
import pytest

from edgespec.errors import GenerationError
from edgespec.runtime import Bundle, SpeculativeDecoder
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
