"""What the answer store (runtime/answer_store.py) costs a round: `lookup.with_store` (the context's tail
as a list, the hashed lookup, the checks and the backward extension) timed at every position of
generations over a store of earlier answers, where it hits (an answer re-asked) and where it misses (new
text), and a record. Realistic text: Python standard-library source tokenised by the bundle's target
tokenizer, cut into answers of --answer-tokens.

    python benchmarks/store_lookup_cost.py --bundle B [--answers 50] [--answer-tokens 300]
"""
from __future__ import annotations

import argparse
import inspect
import time

import numpy as np

from edgespec.runtime import Bundle
from edgespec.runtime.answer_store import DEFAULT_STORE_MB, AnswerStore
from edgespec.runtime.lookup import with_store

MODULES = ("argparse", "json.decoder", "csv", "textwrap", "difflib", "logging", "inspect", "typing")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bundle", required=True)
    ap.add_argument("--answers", type=int, default=50)
    ap.add_argument("--answer-tokens", type=int, default=300)
    args = ap.parse_args()
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


if __name__ == "__main__":
    main()
