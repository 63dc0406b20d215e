"""Constrained decoding on JSON extraction prompts: the grammar's forced tokens as free drafts
(jump-forward), with and without, for `ar-fast` and the speculative default, interleaved per prompt.

    python benchmarks/structured_output.py --bundle BUNDLE [--prompts benchmarks/json_extraction.jsonl]
        [--threads 2] [--max-new-tokens 128] [--repeats 1] [--json OUT]

Each prompt (`json_extraction.jsonl`: a chat prompt and the JSON schema of its answer) runs greedy
through every row, one after the other (same decoder sessions, same threads):
- `ar` (exact 1-token steps, no forced drafts): the reference every row's tokens must equal;
- `ar-fast` (plain_steps="fast") without and with forced drafts (`+jf`);
- `auto` (the decoder's default speculation) without and with forced drafts.
Per row: decode tok/s (median over prompts, and the ratio to `ar-fast` per prompt, median), tau
(committed tokens per target forward after the prefill), the strategy's acceptance, forced tokens
drafted / kept, schema-valid outputs, tokens equal to `ar`, and the grammar's mask cost per mask
against one plain step (`ar`'s verify ms per forward).
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

ROWS = [("ar", "ar", {}, False), ("ar-fast", "ar", {"plain_steps": "fast"}, False),
        ("ar-fast+jf", "ar", {"plain_steps": "fast"}, True), ("auto", "auto", {}, False), ("auto+jf", "auto", {}, True)]


def _llama_server(url: str, msgs: list, schema: dict, max_tokens: int) -> dict:
    """One greedy json_schema chat completion from llama-server: its own decode rate and the output's validity."""
    import httpx

    body = {"messages": msgs, "temperature": 0, "max_tokens": max_tokens, "cache_prompt": False,
            "response_format": {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}}
    r = httpx.post(url.rstrip("/") + "/v1/chat/completions", json=body, timeout=600).json()
    text = r["choices"][0]["message"]["content"]
    t = r.get("timings", {})
    return {"decode_tps": float(t.get("predicted_per_second") or 0.0), "new": int(t.get("predicted_n") or 0),
            "prompt_ms": t.get("prompt_ms"), "valid": _valid(text, schema), "text": text,
            "finish": "stop" if r["choices"][0].get("finish_reason") == "stop" else "length",
            "tau": None, "grammar_ms": 0.0, "masks": 0}


def _valid(text: str, schema: dict) -> bool:
    try:
        value = json.loads(text)
    except ValueError:
        return False
    try:
        import jsonschema
    except ImportError:          # the [test] extra has it; without it: well-formed JSON
        return True
    return jsonschema.Draft202012Validator(schema).is_valid(value)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bundle", required=True)
    ap.add_argument("--prompts", default=str(Path(__file__).with_name("json_extraction.jsonl")))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--json")
    ap.add_argument("--llama-server", metavar="URL",
                    help="also ask a running llama-server (same GGUF, --jinja) for each prompt with the same "
                         "json_schema, interleaved: its decode rate (timings.predicted_per_second) and validity")
    args = ap.parse_args(argv)

    from edgespec.runtime import Bundle, SpeculativeDecoder

    bundle = Bundle.load(args.bundle, verify="fast")
    base = SpeculativeDecoder(bundle, threads=args.threads)
    decoders = {name: base.variant(strategy, **changes) for name, strategy, changes, _ in ROWS}
    jump = {name: jf for name, _, _, jf in ROWS}
    prompts = [json.loads(line) for line in Path(args.prompts).read_text().splitlines() if line.strip()]
    base.generate(prompts[0]["prompt"], max_new_tokens=4, chat=True, json_schema=prompts[0]["schema"])   # warm-up
    rows = []
    for rep in range(args.repeats):
        for p in prompts:
            msgs = [{"role": "user", "content": p["prompt"]}]
            out = {}
            for name, dec in decoders.items():
                r = dec.generate(msgs, max_new_tokens=args.max_new_tokens, chat=True, json_schema=p["schema"],
                                 jump_forward=jump[name])
                st = r.stats
                out[name] = {"tokens": r.token_ids, "new": st.new_tokens, "decode_tps": st.decode_tokens_per_s,
                             "tau": st.tau, "drafted": st.drafted, "accepted": st.accepted, "forced": st.forced,
                             "forced_accepted": st.forced_accepted, "forwards": st.verify_forwards,
                             "verify_ms": st.verify_ms, "grammar_ms": st.grammar_ms, "masks": st.grammar_masks,
                             "finish": r.finish_reason, "valid": _valid(r.text, p["schema"]), "text": r.text}
            if args.llama_server:
                out["llama-server"] = _llama_server(args.llama_server, msgs, p["schema"], args.max_new_tokens)
                out["llama-server"]["tokens"] = None
            ref = out["ar"]["tokens"]
            step_ms = out["ar"]["verify_ms"] / max(out["ar"]["forwards"], 1)
            row = {"id": p["id"], "repeat": rep, "plain_step_ms": step_ms, "rows": {}}
            for name, o in out.items():
                o["same_as_ar"] = o.pop("tokens") == ref
                o["vs_ar_fast"] = o["decode_tps"] / out["ar-fast"]["decode_tps"] if out["ar-fast"]["decode_tps"] else None
                o["mask_share_of_step"] = (o["grammar_ms"] / o["masks"]) / step_ms if o["masks"] and step_ms else None
                row["rows"][name] = o
            rows.append(row)
            print(json.dumps({"id": p["id"], **{n: (round(o["decode_tps"], 2), round(o["tau"] or 0, 2), o["valid"],
                                                     o["same_as_ar"]) for n, o in out.items()}}), flush=True)
    summary = {}
    if args.llama_server:
        ls = [r["rows"]["llama-server"] for r in rows]
        summary["llama-server"] = {"median_decode_tps": statistics.median(o["decode_tps"] for o in ls),
                                   "valid": sum(o["valid"] for o in ls), "outputs": len(ls)}
        for name in decoders:
            summary[name + "_vs_llama_server"] = statistics.median(
                r["rows"][name]["decode_tps"] / r["rows"]["llama-server"]["decode_tps"] for r in rows)
    for name in decoders:
        rs = [r["rows"][name] for r in rows]
        drafted, forced = sum(o["drafted"] for o in rs), sum(o["forced"] for o in rs)
        new = sum(o["new"] for o in rs)
        summary[name] = {
            "median_decode_tps": statistics.median(o["decode_tps"] for o in rs),
            "median_vs_ar_fast": statistics.median(o["vs_ar_fast"] for o in rs),
            "tau": (new - len(rs)) / max(sum(o["forwards"] for o in rs), 1),
            "acceptance": sum(o["accepted"] for o in rs) / drafted if drafted else None,
            "forced": forced, "forced_kept": sum(o["forced_accepted"] for o in rs),
            "forced_share_of_tokens": sum(o["forced_accepted"] for o in rs) / new if new else None,
            "valid": sum(o["valid"] for o in rs), "complete": sum(o["finish"] == "stop" for o in rs),
            "same_as_ar": sum(o["same_as_ar"] for o in rs), "outputs": len(rs),
            "mask_ms_per_mask": sum(o["grammar_ms"] for o in rs) / max(sum(o["masks"] for o in rs), 1),
            "median_mask_share_of_step": statistics.median(o["mask_share_of_step"] for o in rs
                                                           if o["mask_share_of_step"] is not None),
        }
    summary["plain_step_ms_median"] = statistics.median(r["plain_step_ms"] for r in rows)
    print(json.dumps(summary, indent=2))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"args": vars(args), "summary": summary, "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
