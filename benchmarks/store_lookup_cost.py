"""What the answer store (runtime/samplers/answer_store.py) costs a round: `lookup.with_store` (the context's tail
as a list, the hashed lookup, the checks and the backward extension) timed at every position of
generations over a store of earlier answers, where it hits (an answer re-asked) and where it misses (new
text), and a record. Realistic text: Python standard-library source tokenised by the bundle's target
tokenizer, cut into answers of --answer-tokens.

With --chat PROMPTS: what it costs or earns on ordinary chat. One default decoder (threads 2), each
prompt of the split generated twice per repeat, in alternating order: "on" in a draft scope that holds
this repeat's answers to the OTHER prompts before it (a server that answered other chats; never an
answer to the same prompt), "off" in a scope of its own that holds nothing (the store looked up, never
drafting: the same as a store turned off, its lookups included). Reported: pooled decode rate on/off,
per-prompt ratios, what the store drafted and kept, and whether on's outputs equal off's (greedy).

    python benchmarks/store_lookup_cost.py --bundle B [--answers 50] [--answer-tokens 300]
    python benchmarks/store_lookup_cost.py --bundle B --chat benchmarks/heldout13.jsonl [--split test]
        [--max-new-tokens 96] [--repeats 2]
"""
from __future__ import annotations

import argparse
import inspect
import time

import numpy as np

from edgespec.calibrate.prompts import load_prompts
from edgespec.runtime import Bundle, SpeculativeDecoder
from edgespec.runtime.samplers.answer_store import DEFAULT_STORE_MB, AnswerStore
from edgespec.runtime.samplers.lookup import with_store

MODULES = ("argparse", "json.decoder", "csv", "textwrap", "difflib", "logging", "inspect", "typing")


def chat(bundle, prompts: str, split: str, max_new_tokens: int, repeats: int, threads: int = 2) -> dict:
    """Store on against off on chat prompts (module docstring); returns {"ratio", "drafted", "kept", "equal"}."""
    dec = SpeculativeDecoder(bundle, threads=threads)
    todo = [p for p in load_prompts(prompts, split) if p.text and p.text.strip()]
    rates, totals, store, equal = {}, {"on": [0, 0.0], "off": [0, 0.0]}, [0, 0], 0
    for rep in range(repeats):
        for i, p in enumerate(todo):
            order = [("on", f"on/{rep}"), ("off", f"off/{rep}/{i}")]
            out = {}
            for name, scope in order if (i + rep) % 2 == 0 else order[::-1]:
                st = (res := dec.generate(p.text, max_new_tokens=max_new_tokens, chat=True, draft_scope=scope)).stats
                n, ms = st.new_tokens - st.prefill_tokens, st.total_ms - st.ttft_ms
                totals[name][0] += n
                totals[name][1] += ms
                rates.setdefault((p.id, name), []).append(n / max(ms, 1e-9))
                out[name] = res
            store[0] += out["on"].stats.store_drafted
            store[1] += out["on"].stats.store_accepted
            equal += out["on"].token_ids == out["off"].token_ids
    dec.close()
    ratio = (totals["on"][0] / totals["on"][1]) / (totals["off"][0] / totals["off"][1])
    for p in todo:
        on, off = (float(np.median(rates[(p.id, k)])) for k in ("on", "off"))
        print(f"{p.id:24s} on/off {on / off:6.3f}")
    print(f"pooled decode rate, store on / off: {ratio:.3f}x; store drafted {store[0]}, kept {store[1]}; "
          f"outputs equal {equal}/{repeats * len(todo)}")
    return {"ratio": ratio, "drafted": store[0], "kept": store[1], "equal": equal, "n": repeats * len(todo)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bundle", required=True)
    ap.add_argument("--answers", type=int, default=50)
    ap.add_argument("--answer-tokens", type=int, default=300)
    ap.add_argument("--chat", default=None, help="chat prompts (jsonl): store on against off")
    ap.add_argument("--split", default="test")
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    if args.chat:
        chat(args.bundle, args.chat, args.split, args.max_new_tokens, args.repeats)
        return
    tok = Bundle.load(args.bundle).target.tokenizer
    text = "".join(inspect.getsource(__import__(m, fromlist=["_"])) for m in MODULES)
    ids = tok.encode(text, add_special_tokens=False).ids
    size, n = args.answer_tokens, args.answers
    assert len(ids) >= (2 * n + 4) * size, "not enough text"
    docs = [ids[i * size:(i + 1) * size] for i in range(2 * n + 4)]
    store = AnswerStore(int(DEFAULT_STORE_MB * 2**20))
    t = time.perf_counter()
    for d in docs[:n]:
        store.record(d[:64], d[64:])
    record_ms = (time.perf_counter() - t) * 1e3 / n
    print(f"store: {len(store)} answers of {size} tokens, {store.nbytes / 2**20:.1f} MB allocated; "
          f"record {record_ms:.3f} ms an answer")
    for label, histories in (("hit (an answer re-asked)", docs[:4]), ("miss (new text)", docs[n:n + 4])):
        times, found = [], 0
        for prompt in histories:
            history = np.asarray(docs[-1] + prompt, dtype=np.int64)
            for i in range(size, history.size):
                t = time.perf_counter()
                got, _, stored = with_store(store, None, history[:i], [], 0, 8)
                times.append((time.perf_counter() - t) * 1e6)
                found += stored
        us = np.asarray(times)
        print(f"{label:26s} rounds {us.size}, from the store {found}: median {np.median(us):.1f} us, "
              f"p99 {np.percentile(us, 99):.1f} us, max {us.max():.1f} us")
    # a round that follows its match (no hash lookup) and sizes its draft by the cost model (ngram.py)
    for w, ms in ((1, 40.0), (2, 50.0), (5, 80.0), (9, 135.0)):
        store.observe(w, ms)
    times = []
    for prompt in docs[:4]:
        match = store.find(prompt[:32])
        for i in range(32, size - 1):
            t = time.perf_counter()
            match = store.follow(match, prompt[i:i + 1]) if match else None
            got = store.continuation(match, store.draft_length(min(match.m, 32))) if match else []
            times.append((time.perf_counter() - t) * 1e6)
            found += bool(got)
    us = np.asarray(times)
    print(f"{'follow + draft length':26s} rounds {us.size}: median {np.median(us):.1f} us, "
          f"p99 {np.percentile(us, 99):.1f} us, max {us.max():.1f} us")


if __name__ == "__main__":
    main()
