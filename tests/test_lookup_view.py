"""Prompt lookup in the prompt's JSON-string view (runtime/samplers/lookup.py): where the output is JSON, a
file the prompt holds comes back escaped, and the view is where its continuation is found. Checked
against a brute-force search, with real tokenizers, and on a constrained generation (greedy output equal
to `ar`'s)."""
import json

import numpy as np
import pytest

from edgespec.runtime import Bundle, SpeculativeDecoder
from edgespec.runtime.samplers.lookup import json_string_view, lookup, suffix_ends

FILE = 'def greet(name):\n    """Say hello."""\n    return "Hello, " + name + "!"\n\n\nprint(greet("Ada"))\n'


def brute_ends(view, hist, max_n):
    ends = {}
    for n in range(1, max_n + 1):
        for p in range(len(view) - 2, n - 2, -1):
            if list(view[p - n + 1:p + 1]) == list(hist[-n:]):
                ends[n] = p
                break
    return ends


def test_suffix_ends_equal_a_brute_force_search():
    rng = np.random.default_rng(0)
    for _ in range(300):
        view = rng.integers(0, 5, size=int(rng.integers(2, 60)))
        hist = rng.integers(0, 5, size=int(rng.integers(1, 8)))
        got = suffix_ends(view, hist, 4)
        want = brute_ends(view, hist, min(4, len(hist)))
        # suffix_ends stops at the first n without a match; a longer one cannot match then
        assert got == {n: p for n, p in want.items() if all(m in want for m in range(1, n + 1))}


def brute_lookup(hist, max_n, gamma):
    """Prompt lookup by its definition: the largest n whose last-n suffix occurs earlier (ending before
    the last position), its latest occurrence, the tokens after it."""
    for n in range(min(max_n, len(hist) - 1), 0, -1):
        starts = [i for i in range(len(hist) - n) if list(hist[i:i + n]) == list(hist[-n:])]
        if starts:
            return list(hist[starts[-1] + n:starts[-1] + n + gamma]), n
    return [], 0


def test_lookup_in_the_context_equals_its_definition():
    rng = np.random.default_rng(1)
    for _ in range(500):
        hist = rng.integers(0, int(rng.integers(2, 6)), size=int(rng.integers(0, 40)))
        for max_n, gamma in ((4, 3), (1, 2), (6, 8)):
            assert lookup(hist, max_n, gamma) == brute_lookup(hist, max_n, gamma)


def test_lookup_searches_the_view_where_the_context_has_no_longer_match():
    view = np.array([7, 8, 9, 10, 11, 12])
    # the context ends in 8 9; it holds "9 5" earlier (n = 1), the view "8 9 10" (n = 2): the view's wins
    hist = np.array([9, 5, 3, 8, 9])
    assert lookup(hist, 4, 3, view=view) == ([10, 11, 12], 2)
    assert lookup(hist, 4, 3) == ([5, 3, 8], 1)
    # at the same n the context's own occurrence comes first
    hist = np.array([8, 9, 4, 8, 9])
    assert lookup(hist, 4, 2, view=view) == ([4, 8], 2)
    assert lookup(np.array([1, 2]), 4, 2, view=view) == ([], 0)


@pytest.mark.parametrize("kind", ["bytelevel", "spiece"])
def test_the_view_is_the_prompt_as_a_json_string(tiny_tokenizers, kind):
    tok = tiny_tokenizers[kind]
    ids = tok.encode("Read this file:\n" + FILE, add_special_tokens=False).ids
    view = json_string_view(tok, ids)
    text = tok.decode(list(ids), skip_special_tokens=False)
    assert tok.decode(view.tolist(), skip_special_tokens=False) == json.dumps(text, ensure_ascii=False)[1:-1]
    assert "\n" not in tok.decode(view.tolist())


def test_a_file_written_back_in_a_tool_call_is_found_in_the_view(tiny_tokenizers):
    """Greedy guesses along the call's tokens: from the view most are right, from the prompt far fewer."""
    tok = tiny_tokenizers["bytelevel"]
    prompt = tok.encode("<tool_response>\n" + FILE + "</tool_response>", add_special_tokens=False).ids
    head = tok.encode('{"name": "write_file", "arguments": {"path": "greet.py", "content": "',
                      add_special_tokens=False).ids
    call = head + tok.encode(json.dumps(FILE)[1:] + "}}", add_special_tokens=False).ids
    view = json_string_view(tok, prompt)

    def right(with_view):
        hits = 0
        for i in range(len(head) + 1, len(call) - 3):
            found, _ = lookup(np.asarray(prompt + call[:i]), 4, 1, view=view if with_view else None)
            hits += found[:1] == [call[i]]
        return hits / (len(call) - 4 - len(head))
    assert right(True) > 0.8 and right(True) > right(False) + 0.2


@pytest.mark.parametrize("strategy", ["ngram", "auto"])
def test_constrained_lookup_with_the_view_stays_lossless(tiny_same_bundle, strategy):
    schema = {"type": "object", "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
              "required": ["path", "content"], "additionalProperties": False}
    b = Bundle.load(tiny_same_bundle)
    prompt = "Write this file back as JSON:\n" + FILE
    want = SpeculativeDecoder(b, strategy="ar", threads=1).generate(prompt, max_new_tokens=40, json_schema=schema)
    dec = SpeculativeDecoder(b, strategy=strategy, threads=1)
    got = dec.generate(prompt, max_new_tokens=40, json_schema=schema)
    assert got.token_ids == want.token_ids
    assert dec.last_generation.lookup_view is not None and dec.last_generation.lookup_view.size > 10
    dec.generate(prompt, max_new_tokens=8)
    assert dec.last_generation.lookup_view is None              # unconstrained: no view
