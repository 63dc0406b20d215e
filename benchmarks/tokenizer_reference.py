"""edgespec's GGUF tokenizers against llama.cpp's `llama-tokenize` on the same GGUF, line by line.

    python benchmarks/tokenizer_reference.py --llama-tokenize /work/llamacpp/build/bin/llama-tokenize \
        [--models gemma3-270m smollm2-135m ...] [--corpus benchmarks/tokenizer_corpus.jsonl] \
        [--transformers] [--json out.json] [--write-expected tests/data/smollm2_reference_ids.json]

For each recipe model whose GGUF is on this machine (pulled; nothing is installed here): every corpus
line is tokenized by edgespec's converter (models/gguf_tokenizer.py) and by llama.cpp (no BOS,
special tokens parsed), and the script counts lines with identical ids and lines where
decode(encode(x)) == x (a SentencePiece vocabulary cannot round-trip a literal "▁", U+2581: it is
how spaces are written, so llama.cpp and edgespec both decode it as a space). `--transformers` also counts agreement with the pinned transformers' own GGUF
conversion (AutoTokenizer.from_pretrained(dir, gguf_file=...); slow, and wrong for Gemma-3).
`--write-expected` stores llama.cpp's ids of models.tokenizer_reference.REFERENCE_LINES for the first
model, the file tests/test_gguf_tokenizer.py checks in CI without llama.cpp.
Exit status 1 if any line differs or fails the round trip.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from edgespec.models import model_recipes
from edgespec.models import tokenizer_reference as ref
from edgespec.models.gguf_tokenizer import build_tokenizer, read_vocab, special_tokens
from edgespec.models.weights import local_gguf

HERE = Path(__file__).resolve().parent


def transformers_agreement(gguf: Path, ours, lines: list[str]) -> int:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    return sum(tok.encode(t, add_special_tokens=False) == ours.encode(t, add_special_tokens=False).ids for t in lines)


def _one_line_each(doc: dict) -> str:
    """JSON with one line per scalar field and per list entry (a readable diff when ids change)."""
    out = ["{"]
    for k, v in doc.items():
        if isinstance(v, list):
            out += [f"{json.dumps(k)}: ["] + [json.dumps(x, ensure_ascii=False) + ("," if i < len(v) - 1 else "")
                                             for i, x in enumerate(v)] + ["],"]
        else:
            out.append(f"{json.dumps(k)}: {json.dumps(v, ensure_ascii=False)},")
    out[-1] = out[-1].rstrip(",")
    return "\n".join(out + ["}"]) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--llama-tokenize", help=f"path to llama.cpp's llama-tokenize (default: ${ref.ENV}, PATH)")
    ap.add_argument("--models", nargs="*", help="recipe names (default: every recipe whose GGUF is here)")
    ap.add_argument("--corpus", type=Path, default=HERE / "tokenizer_corpus.jsonl")
    ap.add_argument("--transformers", action="store_true", help="also compare with transformers' GGUF conversion")
    ap.add_argument("--json", type=Path, help="write the results here")
    ap.add_argument("--write-expected", type=Path, help="store llama.cpp's ids of REFERENCE_LINES (first model)")
    args = ap.parse_args(argv)
    binary = ref.find_llama_tokenize(args.llama_tokenize)
    if binary is None:
        print(f"error: no llama-tokenize found (--llama-tokenize or ${ref.ENV})", file=sys.stderr)
        return 2
    lines = ref.load_corpus(args.corpus)
    recipes = model_recipes()
    names = args.models or sorted(recipes)
    results, bad = {}, False
    for name in names:
        gguf = local_gguf(recipes[name])
        if gguf is None:
            print(f"{name}: GGUF not on this machine (edgespec models pull {name}); skipped", file=sys.stderr)
            continue
        t0 = time.time()
        v = read_vocab(gguf)
        sp = special_tokens(v)
        tok = build_tokenizer(v, sp)
        build_s = time.time() - t0
        t0 = time.time()
        res = ref.compare(tok, gguf, lines, binary)
        row = {"gguf": gguf.name, "model": v.model, "pre": v.pre, "build_s": round(build_s, 1),
               "compare_s": round(time.time() - t0, 1), **res.summary(),
               "special": {"bos": sp.bos_id, "eos": sp.eos_id, "eot": sp.eot_id, "pad": sp.pad_id,
                           "add_bos": sp.add_bos, "add_eos": sp.add_eos, "eog": sp.eog_ids,
                           "chat_template": sp.chat_template is not None}}
        # SentencePiece writes a space as "▁": a literal U+2581 in the text becomes the same token, and
        # decodes to a space (llama.cpp's too). Those lines cannot round-trip; any other may not fail.
        ambiguous = {i for i, t in enumerate(lines) if v.model == "llama" and "\u2581" in t}
        row["roundtrip_failed_unexplained"] = sorted(set(res.roundtrip_failures) - ambiguous)
        bos_ref = ref.llama_ids_with_bos(binary, gguf, "Hello")
        row["bos_as_llama_cpp"] = tok.encode("Hello", add_special_tokens=True).ids == bos_ref
        if args.transformers:
            row["transformers_identical"] = transformers_agreement(gguf, tok, lines)
        for i, ours, theirs in res.mismatches[:3]:
            print(f"  {name} line {i} {lines[i][:50]!r}\n    ours  {ours[:24]}\n    llama {theirs[:24]}",
                  file=sys.stderr)
        bad |= res.identical != res.lines or bool(row["roundtrip_failed_unexplained"]) or not row["bos_as_llama_cpp"]
        results[name] = row
        print(f"{name}: {res.identical}/{res.lines} identical to llama.cpp, round trip {res.roundtrip}/{res.lines}"
              + (f" (the others: {res.lines - res.roundtrip - len(row['roundtrip_failed_unexplained'])} with a literal"
                 f" ▁, {len(row['roundtrip_failed_unexplained'])} unexplained)" if res.roundtrip < res.lines else "")
              + (f", transformers {row['transformers_identical']}/{res.lines}" if args.transformers else "")
              + f", BOS as llama.cpp: {row['bos_as_llama_cpp']} (build {build_s:.1f} s)")
        if args.write_expected and name == names[0]:
            expected = {"gguf": gguf.name, "sha256": recipes[name].sha256, "llama_tokenize": "llama.cpp "
                        + ref.llama_version(binary), "lines": list(ref.REFERENCE_LINES),
                        "ids": [ref.llama_ids(binary, gguf, t) for t in ref.REFERENCE_LINES]}
            args.write_expected.write_text(_one_line_each(expected), encoding="utf-8")
    if args.json:
        args.json.write_text(json.dumps({"corpus": str(args.corpus), "lines": len(lines), "llama_tokenize": str(binary),
                                         "results": results}, indent=2) + "\n")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
