"""onnxruntime-genai's own generator beside edgespec's `ar` on the SAME graph (a builder bundle's target),
interleaved per prompt, same thread count: decode tok/s = 1000 / TPOT, greedy.

    python benchmarks/peer_ortgenai.py --bundle bundles/qwen-coder-int4 --prompts benchmarks/mixed.jsonl \
        --threads 2 --max-new-tokens 96 [--json out/peer-ortgenai.json]

Needs the `onnxruntime_genai` module (edgespec[export] installs it). The bundle's target directory already
holds the builder's genai_config.json; this script links the graph into a scratch directory with the
thread count written into that config, so nothing in the bundle changes. Prompts are rendered with the
bundle's chat template and fed to both as token ids. edgespec runs twice: as shipped (1-token steps
padded to 2 when the graph's int4 1-token kernel path differs) and unpadded (the function
onnxruntime-genai computes; its tokens are compared with the peer's).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path


def genai_dir(target_dir: Path, threads: int, scratch: Path) -> Path:
    cfg = json.loads((target_dir / "genai_config.json").read_text())
    so = cfg["model"]["decoder"].setdefault("session_options", {})
    # Its own defaults otherwise (0.15.2's config has no entry for ORT's spinning switch).
    so.update({"intra_op_num_threads": threads, "inter_op_num_threads": 1})
    for f in target_dir.iterdir():
        if f.name != "genai_config.json":
            os.symlink(f.resolve(), scratch / f.name)
    (scratch / "genai_config.json").write_text(json.dumps(cfg, indent=2))
    return scratch


def peer_generate(og, model, ids: list[int], n: int) -> tuple[list[int], float]:
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=len(ids) + n, do_sample=False)
    gen = og.Generator(model, params)
    gen.append_tokens(ids)                 # the prefill (get_next_tokens() would still be the last prompt id)
    gen.generate_next_token()
    out = [int(gen.get_next_tokens()[0])]
    t0 = time.perf_counter()
    while len(out) < n and not gen.is_done():
        gen.generate_next_token()
        out.append(int(gen.get_next_tokens()[0]))
    return out, (time.perf_counter() - t0) * 1e3 / max(1, len(out) - 1)


def edgespec_generate(dec, ids: list[int], n: int) -> tuple[list[int], float]:
    res = dec.generate(ids, max_new_tokens=n)
    st = res.stats
    return res.token_ids, (st.total_ms - st.ttft_ms) / max(1, st.new_tokens - 1)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bundle", required=True)
    ap.add_argument("--prompts", default="benchmarks/mixed.jsonl")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    import onnxruntime_genai as og

    from edgespec.calibrate.prompts import load_prompts
    from edgespec.runtime import Bundle, SpeculativeDecoder

    bundle = Bundle.load(args.bundle, verify="fast")
    ar = SpeculativeDecoder(bundle, strategy="ar", threads=args.threads)
    unpadded = SpeculativeDecoder(bundle, strategy="ar", threads=args.threads)
    unpadded.target.min_tokens = 1
    prompts = load_prompts(args.prompts, "all")
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        model = og.Model(str(genai_dir(Path(args.bundle) / "target", args.threads, Path(scratch))))
        for p in [prompts[0]] + prompts:          # the first prompt twice: warm-up
            ids = ar.encode_prompt(p.text, chat=True)
            g_ids, g_ms = peer_generate(og, model, ids, args.max_new_tokens)
            e_ids, e_ms = edgespec_generate(ar, ids, args.max_new_tokens)
            u_ids, u_ms = edgespec_generate(unpadded, ids, args.max_new_tokens)
            rows.append({"id": p.id, "genai_ms": g_ms, "edgespec_ms": e_ms, "edgespec_unpadded_ms": u_ms,
                         "same_tokens_unpadded": u_ids == g_ids[:len(u_ids)], "same_tokens_padded": e_ids == g_ids[:len(e_ids)]})
            print(json.dumps(rows[-1]), flush=True)
    rows = rows[1:]
    med = {k: statistics.median(r[k] for r in rows) for k in ("genai_ms", "edgespec_ms", "edgespec_unpadded_ms")}
    summary = {"threads": args.threads, "prompts": len(rows), "median_tpot_ms": med,
               "tok_s": {k.replace("_ms", ""): 1000 / v for k, v in med.items()},
               "edgespec_vs_genai": med["genai_ms"] / med["edgespec_ms"],
               "edgespec_unpadded_vs_genai": med["genai_ms"] / med["edgespec_unpadded_ms"],
               "same_tokens_unpadded": sum(r["same_tokens_unpadded"] for r in rows),
               "same_tokens_padded": sum(r["same_tokens_padded"] for r in rows)}
    print(json.dumps(summary, indent=2))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"summary": summary, "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
