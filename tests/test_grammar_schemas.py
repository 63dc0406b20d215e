"""22 JSON schemas of our own (tests/data/json_schemas.json: nested objects, arrays of objects, enums,
integers and numbers with bounds, an exclusive bound, optional fields, nullable anyOf, patterns, const
alternatives, $defs/$ref), each asked of the real SmolLM2 (smollm-self pair) in chat, greedy: every
strategy's output is complete and valid against its schema (jsonschema), and equals constrained `ar`
token for token (with the grammar's forced tokens as drafts)."""
import json
from pathlib import Path

import pytest

from edgespec.runtime import SpeculativeDecoder
from test_rdk import bundle_with_priors  # tests/ is on sys.path (conftest.py)
from test_serve import bundle_path

pytestmark = pytest.mark.real
pytest.importorskip("llguidance")
jsonschema = pytest.importorskip("jsonschema")

CASES = json.loads((Path(__file__).parent / "data" / "json_schemas.json").read_text())
STRATEGIES = ["auto", "tli", "sd", "ngram", "ngram-tli", "slem", "slrs1", "rdk-taylor", "rdk"]
MAX_NEW = 200          # above every schema's longest output (strings, arrays and numbers are bounded)


@pytest.fixture(scope="module")
def bundle(request):
    return bundle_with_priors(bundle_path(request))     # a random prior and M, for rdk-taylor and rdk


@pytest.fixture(scope="module")
def references(bundle):
    dec = SpeculativeDecoder(bundle, strategy="ar", threads=1)
    return [dec.generate(_messages(c), max_new_tokens=MAX_NEW, chat=True, json_schema=c["schema"],
                         jump_forward=False) for c in CASES]


def _messages(case):
    return [{"role": "user", "content": case["prompt"]}]


def _check(case, result):
    assert result.finish_reason == "stop", (case["prompt"], result.text)
    jsonschema.validate(json.loads(result.text), case["schema"], cls=jsonschema.Draft202012Validator)


def test_the_schemas(references):
    assert len(CASES) >= 20
    for case, r in zip(CASES, references):
        jsonschema.Draft202012Validator.check_schema(case["schema"])
        _check(case, r)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_every_strategy_gives_schema_valid_outputs(bundle, references, strategy):
    dec = SpeculativeDecoder(bundle, strategy=strategy, draft_length=4, threads=1)
    for case, ref in zip(CASES, references):
        r = dec.generate(_messages(case), max_new_tokens=MAX_NEW, chat=True, json_schema=case["schema"])
        _check(case, r)
        assert r.token_ids == ref.token_ids, (strategy, case["prompt"])
