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


# --------------------------------------------------------------------------- the real SmolLM2-135M pair
# smollm-self: SmolLM2-135M drafting for itself (head pruned to 8192), plus an in-memory prior and affinity M
# so that rdk-taylor and rdk run too. Every strategy is a variant on one decoder's sessions.
#
# Tolerance: `ar` reads each row off a 1-token step, a speculative strategy off a k-token verify forward;
# on this fp32 graph the two kernel paths round the logits differently, by about 1e-5 relative (up to
# ~5e-5 on an alternative with logprob -10..-20, ~1e-5 on a committed token), where the tiny pairs above
# agree to the bit. So the real-model entries are compared within REAL_TOL * (1 + |logprob|); a wrong row
# (the drafter's, the next position's, the temperature's) is off by 1e-3 or more, as the control shows.
REAL_PROMPTS = ["def fibonacci(n):\n", "The capital of France is"]
REAL_RUNS = [dict(), dict(temperature=0.8, seed=3)]
REAL_N = 24
REAL_TOL = 2e-5
# every registered strategy but `ar` itself (the set is checked: a new strategy must be listed here)
REAL_CASES = [("auto", {}), ("ngram", {}), ("ngram-tli", {"draft_length": 4}), ("tli", {"draft_length": 4}),
              ("sd", {"draft_length": 4}), ("slem", {"draft_length": 4}), ("slrs1", {"draft_length": 4}),
              ("rdk-taylor", {"draft_length": 4}), ("rdk", {"draft_length": 4})]


def _real_gap(a: list[TokenLogprob], b: list[TokenLogprob]) -> float:
    """The largest |difference| / (1 + |logprob|) over the entries and their alternatives; inf where the
    ids (committed or alternatives, in order) differ."""
    if [x.token_id for x in a] != [y.token_id for y in b]:
        return float("inf")
    gaps = [0.0]
    for x, y in zip(a, b):
        if [i for i, _ in x.top] != [i for i, _ in y.top]:
            return float("inf")
        pairs = [(x.logprob, y.logprob), *((p, q) for (_, p), (_, q) in zip(x.top, y.top))]
        gaps += [abs(p - q) / (1.0 + abs(p)) for p, q in pairs]
    return max(gaps)


@pytest.fixture(scope="module")
def smollm(smollm_self_bundle):
    """`ar` on the pair; `smollm.variant(name)` is every other strategy on the same sessions."""
    from test_rdk import bundle_with_priors
    return SpeculativeDecoder(bundle_with_priors(smollm_self_bundle), threads=1).variant("ar")


@pytest.fixture(scope="module")
def smollm_ar(smollm):
    return {(p, i): smollm.generate(p, max_new_tokens=REAL_N, logprobs=5, **run)
            for p in REAL_PROMPTS for i, run in enumerate(REAL_RUNS)}


def _wide_rows(dec, ids: list[int], n: int) -> np.ndarray:
    """The target's rows predicting the last n of `ids`, from one forward over all of them (fresh KV; the
    prefix cache forgets what the sessions held, so the next generation prefills afresh)."""
    dec.target.reset()
    rows = np.array(dec.target.forward(ids, last=n + 1)[:n])
    dec.shared.prefix.forget()
    return rows


def _reference(dec, res, k: int) -> list[TokenLogprob]:
    """The entries of res's tokens computed apart from the runtime: scipy's log_softmax of the raw rows
    of one forward, alternatives sorted by (-logprob, id)."""
    lp = log_softmax(_wide_rows(dec, [*res.prompt_token_ids, *res.token_ids], len(res.token_ids)).astype(np.float64),
                     axis=1)
    ids = np.arange(lp.shape[1])
    return [TokenLogprob(t, float(lp[j, t]), tuple((int(i), float(lp[j, i])) for i in np.lexsort((ids, -lp[j]))[:k]))
            for j, t in enumerate(res.token_ids)]


@pytest.mark.real
def test_real_ars_entries_are_the_raw_rows(smollm, smollm_ar):
    """`ar`'s own entries, greedy and sampled at 0.8, are the raw rows' log_softmax at temperature 1."""
    for (prompt, i), res in smollm_ar.items():
        assert _real_gap(res.logprobs, _reference(smollm, res, 5)) < REAL_TOL, (prompt, REAL_RUNS[i])


@pytest.mark.real
def test_real_every_strategy_gives_ars_logprobs(smollm, smollm_ar):
    from edgespec.runtime.round.strategies import STRATEGIES
    assert {s for s, _ in REAL_CASES} == set(STRATEGIES) - {"ar"}
    for strategy, kw in REAL_CASES:
        dec, drafted = smollm.variant(strategy, **kw), 0
        for prompt in REAL_PROMPTS:
            for i, run in enumerate(REAL_RUNS):
                want = smollm_ar[prompt, i]
                got = dec.generate(prompt, max_new_tokens=REAL_N, logprobs=5, **run)
                assert got.token_ids == want.token_ids, (strategy, prompt, run)
                assert len(got.logprobs) == len(got.token_ids)
                assert _real_gap(got.logprobs, want.logprobs) < REAL_TOL, (strategy, prompt, run)
                drafted += got.stats.drafted
        assert drafted > 0, strategy                       # verify rows were read, not only plain steps


@pytest.mark.real
def test_real_rejection_sampling_and_randomised_read_the_verify_rows(smollm):
    """Unseeded-style paths (rejection sampling, randomised drafting) give other tokens than `ar`: their
    entries must be the target's rows at the tokens they committed (one wide forward over them)."""
    for kw in (dict(coupled_sampling=False), dict(coupled_sampling=False, draft_probability=0.6)):
        dec = smollm.variant("tli", draft_length=4, **kw)
        res = dec.generate(REAL_PROMPTS[0], max_new_tokens=REAL_N, logprobs=3, temperature=0.8, seed=7)
        assert res.stats.drafted > 0 and len(res.logprobs) == len(res.token_ids)
        rows = _wide_rows(smollm, [*res.prompt_token_ids, *res.token_ids], len(res.token_ids))
        assert _real_gap(res.logprobs, token_logprobs(rows, res.token_ids, 3)) < REAL_TOL, kw


@pytest.mark.real
def test_real_constrained_stopped_and_streamed(smollm):
    prompt, fmt = "A JSON object describing a cat:", dict(response_format={"type": "json_object"})
    for run in REAL_RUNS:
        want = smollm.generate(prompt, max_new_tokens=REAL_N, logprobs=5, **fmt, **run)
        assert want.text.lstrip().startswith("{")
        assert _real_gap(want.logprobs, _reference(smollm, want, 5)) < REAL_TOL     # before the grammar's mask
        for strategy in ("auto", "ngram", "tli", "slem"):          # forced rounds, token-level drafts, strings
            got = smollm.variant(strategy, draft_length=4).generate(prompt, max_new_tokens=REAL_N, logprobs=5,
                                                                    **fmt, **run)
            assert got.token_ids == want.token_ids, (strategy, run)
            assert len(got.logprobs) == len(got.token_ids)
            assert _real_gap(got.logprobs, want.logprobs) < REAL_TOL, (strategy, run)
    full = smollm.generate(REAL_PROMPTS[0], max_new_tokens=32, logprobs=2)
    tli = smollm.variant("tli", draft_length=4)
    stop = smollm.bundle.target.tokenizer.decode(full.token_ids[12:14])
    assert stop.strip(), stop
    cut = tli.generate(REAL_PROMPTS[0], max_new_tokens=32, logprobs=2, stop=stop)
    assert cut.finish_reason == "stop" and len(cut.logprobs) == len(cut.token_ids) < len(full.token_ids)
    assert _real_gap(cut.logprobs, full.logprobs[:len(cut.token_ids)]) < REAL_TOL
    assert cut.token_ids == full.token_ids[:len(cut.token_ids)]
    sizes = []
    for _ in tli.stream(REAL_PROMPTS[0], max_new_tokens=32, logprobs=2, stop=stop):
        gen = tli.last_generation
        sizes.append(len(gen.logprobs))
        assert len(gen.logprobs) == len(gen.generated)
    assert sizes == sorted(sizes) and tli.last_result.token_ids == cut.token_ids
    assert _real_gap(tli.last_result.logprobs, cut.logprobs) < REAL_TOL


@pytest.mark.real
def test_real_wrong_rows_fail_the_comparison(smollm, smollm_ar):
    """Negative control on the real pair: the drafter's rows (its pruned head, scattered to target ids),
    the next position's rows or the temperature's rows all miss `ar`'s entries by far more than
    REAL_TOL, while the target's own rows from one wide forward are within it."""
    want = smollm_ar[REAL_PROMPTS[0], 0]
    ids, n = [*want.prompt_token_ids, *want.token_ids], len(want.token_ids)
    rows = _wide_rows(smollm, ids, n)
    assert _real_gap(token_logprobs(rows, want.token_ids, 5), want.logprobs) < REAL_TOL
    tli = smollm.variant("tli")
    if tli.drafter.pending:
        tli.drafter.build()
    tli.drafter.reset()
    kept = np.asarray(tli.drafter.forward(ids, last=n + 1)[:n], dtype=np.float32)
    smollm.shared.prefix.forget()
    index_map = np.asarray(smollm.bundle.index_map)
    drafter_rows = np.full(rows.shape, -np.inf, dtype=np.float32)
    drafter_rows[:, index_map[index_map >= 0]] = kept[:, index_map >= 0]
    for wrong in (drafter_rows, np.roll(rows, 1, axis=0), rows / 0.8):
        assert _real_gap(token_logprobs(wrong, want.token_ids, 5), want.logprobs) > 1e-3
