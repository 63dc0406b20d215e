"""benchmarks/schema_suite.py's core on a few of the held-out real-world schemas
(benchmarks/schema_suite.jsonl), asked of the real SmolLM2 (smollm-self pair) in chat, greedy: every
compiled schema's complete output validates, no generation fails, and the default decoder's output
equals constrained `ar`'s token for token; a schema refused as written names its reason in one line and
compiles with the "x-guidance" option that the refusal names. The set itself: 50+ schemas, each with
its prompt and its source (package, version, path, license), valid against its own draft's metaschema.
The whole run is on the int4 Qwen2.5-Coder pair (docs/structured-output.md)."""
import io
import json
import sys
from pathlib import Path

import pytest

from edgespec.runtime import SpeculativeDecoder
from test_serve import bundle_path  # tests/ is on sys.path (conftest.py)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import schema_suite  # noqa: E402

jsonschema = pytest.importorskip("jsonschema")

# answers SmolLM2 completes within 96 tokens: nested objects, enums, booleans and integers, arrays of
# strings, maps (additionalProperties), and a oneOf refusal (compiled with coerce_one_of)
IDS = ["check-jsonschema/github-workflows-require-timeout", "poetry-core/dependency-groups-schema",
       "jupyterlab/application-extension/shell", "jupyterlab/apputils-extension/kernels-settings"]


def test_the_set():
    cases = schema_suite.load_cases()
    assert len(cases) >= 50 and len({c["id"] for c in cases}) == len(cases)
    for c in cases:
        assert c["prompt"].strip() and set(c["source"]) == {"package", "version", "path", "license"}, c["id"]
        jsonschema.validators.validator_for(c["schema"]).check_schema(c["schema"])
    assert sum(len(json.dumps(c["schema"])) for c in cases) < 400_000


def test_refusal_kinds():
    kind = schema_suite.refusal_kind
    assert kind('json schema is not supported: Unimplemented keys: ["if", "then"] (2 times); add') == "unimplemented if, then"
    assert kind("oneOf constraints are not supported. Enable 'coerce_one_of'") == "oneOf"


@pytest.mark.real
def test_the_suite_on_smollm(request):
    pytest.importorskip("llguidance")
    decoder = SpeculativeDecoder(bundle_path(request), threads=1)
    cases = schema_suite.load_cases(ids=IDS)
    assert [c["id"] for c in cases] == sorted(IDS, key=[c["id"] for c in schema_suite.load_cases()].index)
    out = io.StringIO()
    # the one-line layout: SmolLM2-135M completes all three in it (pretty-printed, it wrote a number of
    # zeros into kernels-settings' kernelInfoTimeout until the budget: a valid prefix, equal to ar)
    result = schema_suite.run(decoder, cases, max_new_tokens=96, x_guidance=True, out=out, layout="fixed")
    assert not result["defects"], out.getvalue()
    s = result["summary"]["as_written"]
    assert (s["compiled"], s["refused"]) == (3, {"oneOf": 1}), out.getvalue()
    assert s["errors"] == 0 and s["equal"] == 3 and s["complete"] == 3 and s["valid"] == s["complete"], out.getvalue()
    refused = next(r for r in result["rows"] if not r["compiled"])
    assert "\n" not in refused["refused"] and '"x-guidance": {"coerce_one_of": true}' in refused["refused"]
    approx = result["summary"]["x_guidance"]
    assert (approx["compiled"], approx["valid"], approx["equal"], approx["errors"]) == (1, 1, 1, 0), out.getvalue()
    # edgespec's layout and llguidance's any-whitespace one: no defect (valid when complete, equal to ar)
    for layout in ("default", "flexible"):
        run = schema_suite.run(decoder, cases[1:3], max_new_tokens=96, out=out, layout=layout)
        assert not run["defects"] and run["summary"]["as_written"]["valid"] >= 1, out.getvalue()


def test_refusals_say_where_the_option_goes():
    """A refusal names the "x-guidance" option that compiles the schema (min/maxProperties over optional
    keys too: bamboo-spec's refusal named none) and not llguidance's own advice, which names the option
    but not where it goes."""
    pytest.importorskip("llguidance")
    from edgespec.errors import GenerationError
    from edgespec.runtime.samplers.grammar import constraint_from

    schemas = [({"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "integer"}},
                 "minProperties": 1}, "lenient"),
               ({"type": "object", "properties": {"v": {"oneOf": [{"type": "string", "maxLength": 3},
                                                                   {"type": "string", "pattern": "^x"}]}}}, "coerce_one_of")]
    for schema, option in schemas:
        with pytest.raises(GenerationError) as e:
            constraint_from(json_schema=schema)
        msg = str(e.value)
        assert "\n" not in msg and f'add "x-guidance": {{"{option}": true}} to the schema' in msg, msg
        assert "Enable 'coerce_one_of' option" not in msg, msg
        constraint_from(json_schema={**schema, "x-guidance": {option: True}})


def test_a_layout_in_the_schema_is_its_own():
    """edgespec's layout (the model's own whitespace, at most MAX_JSON_WHITESPACE characters between two
    tokens) unless the schema's "x-guidance" names a layout key: then the schema's. (A fixed one-line
    layout made Qwen2.5-Coder answer `{}` to 27 of the suite's schemas whose keys are all optional: it
    wants a newline after `{`.) Tool calls keep the one-line layout (serve/tools.py)."""
    pytest.importorskip("llguidance")
    from edgespec.runtime.samplers.grammar import JSON_OPTIONS, TOOL_CALL_JSON, constraint_from

    def options(schema):
        return json.loads(constraint_from(json_schema=schema).grammar)["grammars"][0]["json_schema"]["x-guidance"]

    assert options({"type": "object"}) == JSON_OPTIONS
    assert options({"type": "object", "x-guidance": {"whitespace_flexible": True}}) == {"whitespace_flexible": True}
    assert options({"type": "object", "x-guidance": {"lenient": True}}) == {"lenient": True, **JSON_OPTIONS}
    assert TOOL_CALL_JSON["whitespace_flexible"] is False


def test_the_layout_takes_compact_and_pretty_json_and_bounds_whitespace(tiny_tokenizers):
    """Under edgespec's layout a model may write JSON on one line or pretty-printed (tabs, CRLF); runs of
    spaces, blank lines and indents past MAX_JSON_INDENT are refused (a small model cannot loop on
    whitespace, nor pad where its wanted token is forbidden)."""
    llg = pytest.importorskip("llguidance")
    from edgespec.runtime.samplers.grammar import MAX_JSON_INDENT, GrammarTokenizer, constraint_from

    tok = tiny_tokenizers["bytelevel"]
    gt = GrammarTokenizer(tok, tok.get_vocab_size(), [tok.get_vocab_size() - 1])
    schema = {"type": "object", "properties": {"a": {"type": "integer"},
                                               "b": {"type": "array", "items": {"type": "string"}}}}
    grammar = constraint_from(json_schema=schema).grammar

    def accepts(text):
        m = llg.LLMatcher(gt.ll, grammar, log_level=0)
        return all(m.consume_token(t) for t in tok.encode(text, add_special_tokens=False).ids) and m.is_accepting()

    assert accepts('{"a": 1, "b": ["x", "y"]}') and accepts('{"a":1,"b":["x"]}')
    assert accepts('{\n  "a": 1,\n  "b": [\n    "x",\n    "y"\n  ]\n}') and accepts('{\r\n\t"a": 1\r\n}')
    assert accepts("{\n" + " " * MAX_JSON_INDENT + '"a": 1}')
    assert not accepts("{\n" + " " * (MAX_JSON_INDENT + 1) + '"a": 1}')
    assert not accepts('{"a":  1}') and not accepts('{\n\n"a": 1}') and not accepts('{"a": 1}x')
