"""Log-probabilities (runtime/samplers/logprobs.py): each committed token's log-probability is the
target's own, so every strategy, greedy and seeded, gives `ar`'s entries to 1e-5 (the same tokens first),
constrained and cut by a stop string too; a wrong row (the temperature's, or the next position's) fails
the same comparison (the negative control). The server returns them in OpenAI's shapes."""
import numpy as np
import pytest
from scipy.special import log_softmax

from test_coupled import CASES, bundles  # noqa: F401  (the tiny bundles' fixture and every strategy's case)
from edgespec.errors import GenerationError
from edgespec.runtime import Bundle, SpeculativeDecoder
from edgespec.runtime.samplers.logprobs import MAX_TOP_LOGPROBS, TokenLogprob, check_top, token_logprobs

PROMPTS = ["The quick brown", "def add(a, b):"]
RUNS = [dict(), dict(temperature=0.8, seed=5), dict(temperature=1.0, top_k=20, seed=9)]
TOL = 1e-5


def test_token_logprobs_against_log_softmax():
    rng = np.random.default_rng(0)
    rows = rng.normal(size=(4, 300)).astype(np.float32) * 4
    rows[2, [7, 11, 13]] = rows[2].max() + 1.0          # a three-way tie at the top
    tokens = [3, 250, 11, 0]
    got = token_logprobs(rows, tokens, 5)
    ref = log_softmax(rows.astype(np.float64), axis=1)
    for j, (e, t) in enumerate(zip(got, tokens)):
        assert e.token_id == t and abs(e.logprob - ref[j, t]) < 1e-12
        order = sorted(range(300), key=lambda i: (-ref[j, i], i))[:5]
        assert [i for i, _ in e.top] == order and np.allclose([lp for _, lp in e.top], ref[j, order])
    assert [i for i, _ in got[2].top[:3]] == [7, 11, 13]              # ties: lower ids first
    assert token_logprobs(rows, tokens, 0)[0].top == ()


@pytest.mark.parametrize("bad", [-1, MAX_TOP_LOGPROBS + 1, 2.5, True, "3"])
def test_bad_values_are_one_line_errors(bad):
    with pytest.raises(GenerationError) as e:
        check_top(bad)
    assert "\n" not in str(e.value) and "logprobs" in str(e.value)
    assert check_top(None) is None and check_top(0) == 0


def _same(a: list[TokenLogprob], b: list[TokenLogprob]) -> float:
    assert [x.token_id for x in a] == [y.token_id for y in b]
    gaps = [abs(x.logprob - y.logprob) for x, y in zip(a, b)]
    for x, y in zip(a, b):
        assert [i for i, _ in x.top] == [i for i, _ in y.top]
        gaps += [abs(p - q) for (_, p), (_, q) in zip(x.top, y.top)]
    return max(gaps)


@pytest.mark.parametrize("which,strategy,kw", CASES, ids=[f"{w}-{s}{'-rand' if k else ''}" for w, s, k in CASES])
def test_every_strategy_gives_ars_logprobs(bundles, which, strategy, kw):
    ar = SpeculativeDecoder(bundles[which], strategy="ar", draft_length=1, threads=1)
    dec = SpeculativeDecoder(bundles[which], strategy=strategy, threads=1, **kw)
    for prompt in PROMPTS:
        for run in RUNS:
            want = ar.generate(prompt, max_new_tokens=24, logprobs=5, **run)
            got = dec.generate(prompt, max_new_tokens=24, logprobs=5, **run)
            assert got.token_ids == want.token_ids, (prompt, run)
            assert len(got.logprobs) == len(got.token_ids)
            assert _same(got.logprobs, want.logprobs) < TOL, (prompt, run)


def test_constrained_stopped_and_streamed(bundles):
    ar = SpeculativeDecoder(bundles["same"], strategy="ar", draft_length=1, threads=1)
    dec = SpeculativeDecoder(bundles["same"], strategy="tli", threads=1)
    for kw in (dict(response_format={"type": "json_object"}), dict(regex=r"[a-z ]{4,30}")):
        want, got = (d.generate("The quick brown", max_new_tokens=20, logprobs=3, **kw) for d in (ar, dec))
        assert got.token_ids == want.token_ids and _same(got.logprobs, want.logprobs) < TOL
        assert len(got.logprobs) == len(got.token_ids)
    full = ar.generate("The quick brown", max_new_tokens=24, logprobs=2)
    text = full.text
    cut = text[len(text) // 2:len(text) // 2 + 2]
    if cut.strip():
        stopped = dec.generate("The quick brown", max_new_tokens=24, logprobs=2, stop=cut)
        assert len(stopped.logprobs) == len(stopped.token_ids) < len(full.token_ids)
        assert _same(stopped.logprobs, full.logprobs[:len(stopped.logprobs)]) < TOL
    seen = []
    for _ in dec.stream("The quick brown", max_new_tokens=24, logprobs=2):
        seen.append(len(dec.last_generation.logprobs))
    assert seen == sorted(seen) and seen[-1] == len(dec.last_result.token_ids)
    assert _same(dec.last_result.logprobs, full.logprobs) < TOL


def test_the_comparison_sees_wrong_rows(bundles):
    """Negative control: entries read off the temperature's rows, or the next position's row, differ."""
    ar = SpeculativeDecoder(bundles["same"], strategy="ar", draft_length=1, threads=1)
    want = ar.generate("def add(a, b):", max_new_tokens=12, logprobs=3)
    ids = [*ar.encode_prompt("def add(a, b):"), *want.token_ids]
    n = len(want.token_ids)
    ar.target.reset()
    rows = np.asarray(ar.target.forward(ids, last=n + 1))[:n]          # row j predicts token j
    assert _same(token_logprobs(rows, want.token_ids, 3), want.logprobs) < TOL
    assert _same(token_logprobs(rows / 0.7, want.token_ids, 3), want.logprobs) > 1e-3
    shifted = token_logprobs(np.roll(rows, 1, axis=0), want.token_ids, 3)
    with pytest.raises(AssertionError):
        assert _same(shifted, want.logprobs) < TOL


def test_off_costs_nothing(bundles):
    dec = SpeculativeDecoder(bundles["same"], strategy="tli", threads=1)
    res = dec.generate("The quick brown", max_new_tokens=8)
    assert res.logprobs is None and dec.last_generation.logprobs is None
