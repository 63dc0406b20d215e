"""Structured output on held-out real-world JSON schemas: does every compiled schema's complete output
validate, does any generation fail, and does the default decoder's constrained greedy output equal
constrained `ar`'s, token for token?

    python benchmarks/schema_suite.py --bundle BUNDLE [--schemas benchmarks/schema_suite.jsonl]
        [--max-new-tokens 192] [--threads 1] [--ids ID,ID | --limit N] [--x-guidance]
        [--layout default|fixed|flexible] [--json OUT]

Each schema (`schema_suite.jsonl`, written by make_schema_suite.py from the packages that ship them:
SchemaStore via check-jsonschema, JupyterLab's settings, nbformat, Poetry, validate-pyproject, JSON
Resume) is asked for in chat with its short prompt, greedy, first by the default decoder (strategy
`auto`, forced tokens drafted) and then by the same decoder's `ar` variant without forced drafts (the
pure constrained reference), one schema after the other. Per schema:
- compiled, or refused with the one-line reason (before any model runs);
- complete (finish "stop") or cut (by --max-new-tokens);
- valid: a complete output validates against the schema (jsonschema, the schema's own draft);
- equal: the default's token ids equal `ar`'s (both rows, cut or not);
- errors: a GenerationError during a generation (its one line; the partial output is kept).
Totals: refusals by reason, the grammar's mask cost (median over generations of ms per mask), forced
tokens drafted / kept. `--x-guidance` retries every refused schema with `"x-guidance":
{"coerce_one_of": true, "lenient": true}` added (llguidance's approximations, docs/structured-output.md),
reported apart: an output of an approximated schema may break what was approximated (oneOf taken as
anyOf, keys ignored), so its invalid outputs are counted, not failed.

Exit status 1 on any invalid complete output of a schema compiled as written, any generation error,
or any default output different from `ar`'s.
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

APPROXIMATE = {"coerce_one_of": True, "lenient": True}
LAYOUTS = ("default", "fixed", "flexible")     # --layout (layout_options)


def layout_options(layout: str) -> dict:
    """The "x-guidance" layout keys of --layout: none (edgespec's, the model's whitespace bounded:
    grammar.JSON_OPTIONS), the tool calls' one-line layout (grammar.TOOL_CALL_JSON), or any whitespace."""
    from edgespec.runtime.samplers.grammar import TOOL_CALL_JSON

    return {"default": {}, "fixed": TOOL_CALL_JSON, "flexible": {"whitespace_flexible": True}}[layout]


def load_cases(path=None, ids=None, limit=None) -> list[dict]:
    path = Path(path) if path else Path(__file__).with_name("schema_suite.jsonl")
    cases = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    if ids:
        wanted = set(ids)
        cases = [c for c in cases if c["id"] in wanted]
    return cases[:limit] if limit else cases


def refusal_kind(reason: str) -> str:
    """The refusal's reason in a few words, to count refusals by reason."""
    m = re.search(r"Unimplemented keys: (\[[^]]*\])", reason)
    if m:
        return "unimplemented " + ", ".join(json.loads(m.group(1)))
    for key, kind in (("oneOf", "oneOf"), ("min/maxProperties", "min/maxProperties with optional keys"),
                      ("regex parse error", "regex syntax"), ("Unknown format", "unknown format")):
        if key in reason:
            return kind
    return reason[:60]


def validate(text: str, schema) -> tuple[bool, str]:
    """(valid, why not) of an output against its schema, with the schema's own draft."""
    import jsonschema

    try:
        value = json.loads(text)
    except ValueError as e:
        return False, f"not JSON: {e}"
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    err = jsonschema.exceptions.best_match(cls(schema).iter_errors(value))
    return (True, "") if err is None else (False, f"{'/'.join(map(str, err.absolute_path))}: {err.message[:160]}")


def _generate(dec, case, schema, max_new_tokens, jump_forward) -> dict:
    from edgespec.errors import GenerationError

    msgs = [{"role": "user", "content": case["prompt"]}]
    t = time.perf_counter()
    error = None
    try:
        r = dec.generate(msgs, max_new_tokens=max_new_tokens, chat=True, json_schema=schema, jump_forward=jump_forward)
    except GenerationError as e:
        error, r = str(e), dec.last_result
    st = r.stats
    return {"tokens": list(r.token_ids), "text": r.text, "finish": "error" if error else r.finish_reason,
            "error": error, "seconds": time.perf_counter() - t, "new": st.new_tokens,
            "decode_tps": st.decode_tokens_per_s, "forced": st.forced, "forced_kept": st.forced_accepted,
            "mask_ms": st.grammar_ms / st.grammar_masks if st.grammar_masks else None, "masks": st.grammar_masks}


def run_case(default, ar, case, max_new_tokens, approximate=False, layout="default") -> dict:
    """One schema through both rows: the record the module docstring describes."""
    from edgespec.errors import GenerationError

    schema = case["schema"]
    options = {**(APPROXIMATE if approximate else {}), **layout_options(layout)}
    if options:
        schema = {**schema, "x-guidance": {**schema.get("x-guidance", {}), **options}}
    row = {"id": case["id"], "approximated": approximate, "compiled": True, "refused": None}
    try:
        state = default.grammar_state(json_schema=schema)
    except GenerationError as e:
        return {**row, "compiled": False, "refused": str(e)}
    row["notes"] = list(state.notes)
    out = {"auto": _generate(default, case, schema, max_new_tokens, True),
           "ar": _generate(ar, case, schema, max_new_tokens, False)}
    for o in out.values():
        o["valid"], o["why"] = validate(o["text"], case["schema"]) if o["finish"] == "stop" else (None, "")
    row["rows"] = out
    row["equal"] = out["auto"]["tokens"] == out["ar"]["tokens"]
    if not row["equal"]:
        a, b = out["auto"]["tokens"], out["ar"]["tokens"]
        row["first_difference"] = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    row["errors"] = [f"{n}: {o['error']}" for n, o in out.items() if o["error"]]
    return row


def defects(row) -> list[str]:
    """What fails the run in one schema's record (an approximated schema's invalid output does not)."""
    if not row["compiled"]:
        return []
    found = list(row["errors"])
    if not row["equal"]:
        found.append(f"auto differs from ar at token {row['first_difference']}")
    if not row["approximated"]:
        found += [f"{n} invalid: {o['why']}" for n, o in row["rows"].items() if o["valid"] is False]
    return found


def summarize(rows) -> dict:
    def part(rs):
        done = [r for r in rs if r["compiled"]]
        auto = [r["rows"]["auto"] for r in done]
        complete = [r for r in done if r["rows"]["auto"]["finish"] == "stop"]
        masks = [o["mask_ms"] for r in done for o in r["rows"].values() if o["mask_ms"] is not None]
        return {"schemas": len(rs), "compiled": len(done),
                "refused": dict(Counter(refusal_kind(r["refused"]) for r in rs if not r["compiled"])),
                "complete": len(complete), "cut": sum(o["finish"] == "length" for o in auto),
                "valid": sum(r["rows"]["auto"]["valid"] is True for r in complete),
                "valid_ar": sum(o["valid"] is True for r in done for n, o in r["rows"].items() if n == "ar"),
                "complete_ar": sum(r["rows"]["ar"]["finish"] == "stop" for r in done),
                "equal": sum(r["equal"] for r in done), "errors": sum(len(r["errors"]) for r in done),
                "forced_drafted": sum(o["forced"] for o in auto), "forced_kept": sum(o["forced_kept"] for o in auto),
                "mask_ms_median": statistics.median(masks) if masks else None,
                "defects": sum(bool(defects(r)) for r in rs)}
    out = {"as_written": part([r for r in rows if not r["approximated"]])}
    approx = [r for r in rows if r["approximated"]]
    if approx:
        out["x_guidance"] = part(approx)
    return out


def run(decoder, cases, max_new_tokens=192, x_guidance=False, out=sys.stdout, layout="default") -> dict:
    """Every case through `decoder` (the default) and its `ar` variant; prints one line per schema
    and returns {"rows", "summary", "defects"}."""
    ar = decoder.variant("ar")
    rows = []
    for case in cases:
        row = run_case(decoder, ar, case, max_new_tokens, layout=layout)
        rows.append(row)
        _print(row, out)
        if x_guidance and not row["compiled"]:
            row = run_case(decoder, ar, case, max_new_tokens, approximate=True, layout=layout)
            rows.append(row)
            _print(row, out)
    summary = summarize(rows)
    found = {r["id"] + (" (x-guidance)" if r["approximated"] else ""): defects(r) for r in rows if defects(r)}
    return {"rows": rows, "summary": summary, "defects": found}


def _print(row, out) -> None:
    tag = row["id"] + (" +x-guidance" if row["approximated"] else "")
    if not row["compiled"]:
        print(f"{tag}: refused: {row['refused']}", file=out, flush=True)
        return
    a, r = row["rows"]["auto"], row["rows"]["ar"]
    valid = {True: "valid", False: f"INVALID ({a['why']})", None: "-"}[a["valid"]]
    line = (f"{tag}: {a['finish']} {a['new']} tok, {valid}, {'equal' if row['equal'] else 'DIFFERS'} to ar, "
            f"auto {a['seconds']:.1f} s / ar {r['seconds']:.1f} s, forced {a['forced_kept']}/{a['forced']}")
    if row["errors"]:
        line += f", ERRORS: {'; '.join(row['errors'])}"
    print(line, file=out, flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bundle", required=True)
    ap.add_argument("--schemas", help="a schema_suite.jsonl (default: the one beside this script)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--max-new-tokens", type=int, default=192)
    ap.add_argument("--ids", help="only these schema ids (comma-separated)")
    ap.add_argument("--limit", type=int, help="only the first N schemas")
    ap.add_argument("--x-guidance", action="store_true",
                    help='retry refused schemas with "x-guidance": {"coerce_one_of": true, "lenient": true}')
    ap.add_argument("--layout", choices=list(LAYOUTS), default="default",
                    help='default: edgespec\'s (the model\'s whitespace, bounded: grammar.JSON_OPTIONS); fixed: the '
                         'one-line layout of tool calls (", " and ": ", no other whitespace); flexible: every schema '
                         'with "x-guidance": {"whitespace_flexible": true} (any whitespace)')
    ap.add_argument("--json", help="write the rows and the summary here")
    args = ap.parse_args(argv)

    from edgespec.runtime import Bundle, SpeculativeDecoder

    cases = load_cases(args.schemas, args.ids.split(",") if args.ids else None, args.limit)
    decoder = SpeculativeDecoder(Bundle.load(args.bundle, verify="fast"), threads=args.threads)
    t = time.perf_counter()
    result = run(decoder, cases, args.max_new_tokens, args.x_guidance, layout=args.layout)
    result["summary"]["wall_s"] = round(time.perf_counter() - t, 1)
    print(json.dumps(result["summary"], indent=2))
    for sid, found in result["defects"].items():
        print(f"DEFECT {sid}: {'; '.join(found)}")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"args": vars(args), **result}, indent=1))
    return 1 if result["defects"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
