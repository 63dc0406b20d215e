"""Code edits re-sent in fresh conversations (issue 48's edit workload, held out): what the answer store
(runtime/samplers/answer_store.py) earns when an agent sends the same file again with another instruction.

Eight functions from the Python standard library (modules the project's other edit prompts do not use),
each asked twice, in fresh conversations, with two different instructions: all first requests, then all
second ones, on ONE decoder kept alive (its answer store and prefix cache warm, as under `edgespec
serve`). Each request runs on the default decoder and on its `ar-fast` variant (ar with unpadded 1-token
steps, in a draft scope of its own so that its answers never draft for the default), in alternating
order; greedy. Reported: each request's decode rate (tokens after the first / time after the first) over
`ar-fast`'s, the store's accepted drafts, and the pooled ratio of first and of second requests. Every
default output must equal `ar-fast`'s or padded `ar`'s (the lossless rule): a difference is reported
and makes the exit status 1.

    python benchmarks/edits_reuse.py --bundle B [--split test|calib|all] [--max-new-tokens 160] [--threads 2]

Tune on `--split calib` only; report `--split test` (docs/results.md).
"""
from __future__ import annotations

import argparse
import ast
import importlib
import inspect
import sys
import textwrap

from edgespec.runtime import SpeculativeDecoder

FUNCTIONS = (("random", "Random.shuffle"), ("html", "unescape"), ("glob", "glob"), ("shutil", "copyfileobj"),
             ("mimetypes", "guess_type"), ("zipfile", "is_zipfile"), ("dataclasses", "asdict"),
             ("gettext", "translation"))
CALIB = 3                    # the first three functions: calib; the other five: test
SYSTEM = "You are a careful Python programmer. Reply with code only."
TASKS = (("Add type hints to the function `{name}` below.", "Make the function `{name}` below log its arguments "
          "with `logging.debug` when it starts."),
         ("Rename the parameter `{param}` of the function `{name}` below to `{param}_value`.",
          "Add a short comment above each `if` statement of the function `{name}` below."))
SCOPE, BASELINE_SCOPE = "edits", "ar-fast"


def function_source(module: str, qualname: str) -> tuple[str, str, str]:
    """(name, first parameter other than self, dedented source) of a standard-library function."""
    obj = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    src = textwrap.dedent(inspect.getsource(obj))
    fn = ast.parse(src).body[0]
    params = [a.arg for a in fn.args.args if a.arg != "self"] or ["x"]
    return fn.name, params[0], src


def requests(split: str) -> list[tuple[str, int, str]]:
    """[(id, 1 or 2, user message)]: every first request, then every second one."""
    picked = [f for i, f in enumerate(FUNCTIONS) if split == "all" or (i < CALIB) == (split == "calib")]
    out = {1: [], 2: []}
    for i, (module, qualname) in enumerate(picked):
        name, param, src = function_source(module, qualname)
        for turn, task in zip((1, 2), TASKS[i % len(TASKS)]):
            text = task.format(name=name, param=param) + " Reply with the whole function.\n\n```python\n" + src + "```"
            out[turn].append((f"{module}.{qualname}", turn, text))
    return out[1] + out[2]


def decode_rate(stats) -> tuple[int, float]:
    """(tokens after the first, ms after the first token)."""
    return stats.new_tokens - stats.prefill_tokens, stats.total_ms - stats.ttft_ms


def run(bundle, split: str = "test", max_new_tokens: int = 160, threads: int | None = 2, limit: int | None = None,
        out=sys.stdout) -> dict:
    """The benchmark; returns {"first": ratio, "second": ratio, "mismatches": [...], "rows": [...]}."""
    dec = SpeculativeDecoder(bundle, threads=threads)
    fast, ar = dec.variant("ar", plain_steps="fast"), dec.variant("ar")
    chat = bool(dec.bundle.target.chat_template)
    todo = requests(split)
    if limit:
        todo = [r for r in todo if r[0] in {i for i, _, _ in todo[:limit]}]
    totals = {(turn, row): [0, 0.0] for turn in (1, 2) for row in ("default", "ar-fast")}
    rows, mismatches = [], []
    print(dec.planning.current().describe(), file=out, flush=True)
    for k, (rid, turn, text) in enumerate(todo):
        prompt = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": text}] if chat else \
            SYSTEM + "\n\n" + text + "\n"
        room = dec.target.max_position
        if room and len(dec.encode_prompt(prompt, chat)) + max_new_tokens > room:
            print(f"{rid:28s} request {turn}  skipped: longer than the context ({room})", file=out, flush=True)
            continue
        results = {}
        order = [("default", dec, SCOPE), ("ar-fast", fast, BASELINE_SCOPE)]
        for name, d, scope in (order if k % 2 == 0 else order[::-1]):
            results[name] = d.generate(prompt, max_new_tokens=max_new_tokens, chat=chat, draft_scope=scope)
        for name, res in results.items():
            n, ms = decode_rate(res.stats)
            totals[(turn, name)][0] += n
            totals[(turn, name)][1] += ms
        mine, base = results["default"], results["ar-fast"]
        same = mine.token_ids == base.token_ids or \
            mine.token_ids == ar.generate(prompt, max_new_tokens=max_new_tokens, chat=chat,
                                          draft_scope=BASELINE_SCOPE).token_ids
        if not same:
            mismatches.append((rid, turn))
        ratio = (decode_rate(mine.stats)[0] / max(decode_rate(mine.stats)[1], 1e-9)) / \
            max(decode_rate(base.stats)[0] / max(decode_rate(base.stats)[1], 1e-9), 1e-9)
        st = mine.stats
        rows.append(dict(id=rid, turn=turn, ratio=ratio, strategy=st.strategy, tokens=st.new_tokens,
                         store_drafted=st.store_drafted, store_accepted=st.store_accepted, equal=same,
                         forwards=st.verify_forwards, widest=max(map(int, st.verify_ms_by_k), default=0)))
        print(f"{rid:28s} request {turn}  {ratio:5.2f}x ar-fast  ({st.strategy}, {st.new_tokens} tokens, "
              f"{st.verify_forwards} target forwards (ar-fast {base.stats.verify_forwards}), widest "
              f"{rows[-1]['widest']}, store {st.store_accepted}/{st.store_drafted} kept)"
              f"{'' if same else '  OUTPUT DIFFERS'}", file=out, flush=True)
    pooled = {}
    for turn, word in ((1, "first"), (2, "second")):
        (n, ms), (bn, bms) = totals[(turn, "default")], totals[(turn, "ar-fast")]
        pooled[word] = (n / ms) / (bn / bms) if ms and bms and bn else None
    print("pooled decode rate vs ar-fast: " + ", ".join(f"{w} requests {r:.3f}x" if r is not None else f"{w}: none"
                                                        for w, r in pooled.items())
          + f"; outputs equal to ar or ar-fast: {len(rows) - len(mismatches)}/{len(rows)}", file=out, flush=True)
    dec.close()
    return {**pooled, "mismatches": mismatches, "rows": rows}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bundle", required=True)
    ap.add_argument("--split", choices=("test", "calib", "all"), default="test")
    ap.add_argument("--max-new-tokens", type=int, default=160)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--limit", type=int, default=None, help="only the functions of the first N requests (a smoke run)")
    args = ap.parse_args(argv)
    if args.max_new_tokens < 2 or (args.limit is not None and args.limit < 1):
        ap.error("--max-new-tokens must be >= 2 and --limit >= 1")
    result = run(args.bundle, args.split, args.max_new_tokens, args.threads, args.limit)
    return 1 if result["mismatches"] else 0


if __name__ == "__main__":
    sys.exit(main())
