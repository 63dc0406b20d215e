"""Coupled sampling (runtime/samplers/coupled.py): with a seed, every strategy gives `ar`'s tokens with
the same seed, whatever was drafted; the race samples the target's law (chi-square over seeds), and a
lenient verify that keeps a draft the race ranked second fails the same test (the negative control)."""
import numpy as np
import pytest
from scipy import stats as sst

from distribution import ALPHA, check_lossless, sample_tokens  # tests/ is on sys.path (conftest.py)
from test_rdk import bundle_with_priors
from edgespec.errors import GenerationError
from edgespec.runtime import Bundle, SpeculativeDecoder
from edgespec.runtime.round import rounds as rounds_module
from edgespec.runtime.samplers.coupled import RaceNoise, race_pick, verify_coupled
from edgespec.runtime.samplers.sampling import SamplingParams

PROMPTS = ["The quick brown", "def add(a, b):", "Once upon a time"]
SAMPLED = [dict(temperature=1.0), dict(temperature=0.8, top_k=40, top_p=0.9, min_p=0.05),
           dict(temperature=0.6, top_p=0.5)]
# (bundle, strategy, decoder keywords): every strategy the tiny bundles can run
CASES = [("self", "sd", {}), ("same", "sd", {}), ("same", "tli", {}), ("hetero", "tli", {}), ("hetero", "slem", {}),
         ("hetero", "slrs1", {}), ("same", "ngram", {}), ("same", "auto", {}), ("self", "auto", {}),
         ("same", "tli", {"draft_probability": 0.6}), ("priors", "rdk-taylor", {}), ("priors", "rdk", {})]


def test_race_samples_the_law_and_is_keyed_by_seed_and_index():
    p = np.array([0.45, 0.25, 0.15, 0.1, 0.05, 0.0])
    picks = np.array([race_pick(p, RaceNoise(s).at(0, p.size)) for s in range(4000)])
    assert not (picks == 5).any()                                # zero probability never wins
    counts = np.bincount(picks, minlength=6)[:5]
    assert sst.chisquare(counts, p[:5] * 4000).pvalue > ALPHA
    a, b = RaceNoise(3), RaceNoise(3)
    assert np.array_equal(a.at(7, 100), b.at(7, 100))            # the same (seed, index): the same row
    assert not np.array_equal(a.at(7, 100), a.at(8, 100))        # another index, another row
    assert not np.array_equal(a.at(7, 100), RaceNoise(4).at(7, 100))
    assert np.array_equal(RaceNoise(3).at(7, 100)[:60], RaceNoise(3).at(7, 60))   # a prefix is the same race


def test_verify_coupled_keeps_drafts_while_they_are_the_races_picks():
    rng = np.random.default_rng(0)
    p = rng.dirichlet(np.ones(50), size=4)
    noise = RaceNoise(11)
    picks = [race_pick(p[j], noise.at(5 + j, 50)) for j in range(4)]
    assert verify_coupled(p, np.array(picks[:3]), noise, 5) == (3, picks[3])
    wrong = [picks[0], (picks[1] + 1) % 50, picks[2]]
    assert verify_coupled(p, np.array(wrong), noise, 5) == (1, picks[1])
    assert verify_coupled(p[:1], np.array([], dtype=np.int64), noise, 5) == (0, picks[0])


@pytest.fixture(scope="module")
def bundles(tiny_self_bundle, tiny_same_bundle, tiny_hetero_bundle):
    return {"self": Bundle.load(tiny_self_bundle), "same": Bundle.load(tiny_same_bundle),
            "hetero": Bundle.load(tiny_hetero_bundle), "priors": bundle_with_priors(tiny_same_bundle)}


def _tokens(dec, prompt, seed, params, n=24):
    return dec.generate(prompt, max_new_tokens=n, seed=seed, **params).token_ids


@pytest.mark.parametrize("which,strategy,kw", CASES, ids=[f"{w}-{s}{'-rand' if k else ''}" for w, s, k in CASES])
def test_seeded_sampling_gives_ars_tokens_for_every_strategy(bundles, which, strategy, kw):
    b = bundles[which]
    ar = SpeculativeDecoder(b, strategy="ar", threads=1)
    decs = [SpeculativeDecoder(b, strategy=strategy, threads=1, **kw)]
    if strategy not in ("auto", "ngram"):
        decs += [SpeculativeDecoder(b, strategy=strategy, draft_length=k, threads=1, **kw) for k in (1, 3, 6)]
    drafted = kept = 0
    for i, (prompt, params) in enumerate(zip(PROMPTS, SAMPLED)):
        want = _tokens(ar, prompt, 100 + i, params)
        assert _tokens(ar, prompt, 100 + i, params) == want             # ar itself repeats
        for dec in decs:
            for _ in range(2):                                          # again: plan, store and governor moved on
                assert _tokens(dec, prompt, 100 + i, params) == want, (strategy, dec.config.draft_length, prompt)
                drafted += dec.last_result.stats.drafted
                kept += dec.last_result.stats.accepted
    assert drafted > 0                                                  # drafts were verified, not only plain steps
    if which != "hetero" and strategy != "ngram":                       # (unrelated random models: few kept)
        assert kept > 0


def test_seeded_sampling_repeats_across_threads_and_streams(bundles):
    b = bundles["same"]
    want = _tokens(SpeculativeDecoder(b, strategy="ar", threads=1), PROMPTS[1], 5, SAMPLED[0], n=32)
    dec = SpeculativeDecoder(b, strategy="tli", threads=2)
    assert _tokens(dec, PROMPTS[1], 5, SAMPLED[0], n=32) == want
    text = "".join(dec.stream(PROMPTS[1], max_new_tokens=32, seed=5, **SAMPLED[0]))
    assert dec.last_result.token_ids == want and text == dec.last_result.text


def test_seeded_sampling_under_a_grammar_gives_ars_tokens(bundles):
    b = bundles["same"]
    kw = dict(max_new_tokens=24, temperature=0.9, seed=3, regex=r"[a-z ]{4,30}")
    want = SpeculativeDecoder(b, strategy="ar", threads=1).generate(PROMPTS[0], **kw).token_ids
    for strategy in ("tli", "ngram", "auto"):
        assert SpeculativeDecoder(b, strategy=strategy, threads=1).generate(PROMPTS[0], **kw).token_ids == want


def test_rejection_sampling_is_still_there_and_depends_on_the_drafts(bundles):
    """coupled_sampling=False: today's rejection sampling (the seed then fixes ar and sd, not every draft
    length): at least one of several draft lengths differs from ar, or the test says nothing."""
    b = bundles["same"]
    want = _tokens(SpeculativeDecoder(b, strategy="ar", threads=1), PROMPTS[0], 1, SAMPLED[0])
    outs = [_tokens(SpeculativeDecoder(b, strategy="tli", draft_length=k, threads=1,
                                       options={"coupled_sampling": False}), PROMPTS[0], 1, SAMPLED[0]) for k in (1, 2, 4)]
    assert any(o != want for o in outs)


@pytest.mark.parametrize("value", ["yes", 2, None])
def test_a_bad_coupled_sampling_setting_is_one_line(bundles, value):
    with pytest.raises(GenerationError, match="coupled_sampling must be 'auto', True or False"):
        SpeculativeDecoder(bundles["same"], strategy="tli", threads=1, options={"coupled_sampling": value})


N = 2000


def _ids(bundle):
    return bundle.target.tokenizer.encode(PROMPTS[0]).ids


@pytest.mark.parametrize("which", ["self", "same"])
def test_coupled_tli_samples_the_target_distribution(bundles, which):
    b = bundles[which]
    dec = SpeculativeDecoder(b, strategy="tli", draft_length=4, threads=1)
    pvals = check_lossless(dec, b, _ids(b), n=N, seed=0, temperature=1.0)
    assert set(pvals) == {"x1", "x2", "x3|x1x2"}
    assert min(pvals.values()) > ALPHA, pvals


def _lenient_verify(p, drafts, noise, first_index):
    """A deliberately broken coupled verify: a draft is kept when the race ranks it first or second."""
    n = len(drafts)
    for j in range(n + 1):
        score = p[j] / noise.at(first_index + j, p.shape[1])[:p.shape[1]]
        t = int(np.argmax(score))
        if j == n:
            return j, t
        top2 = np.argpartition(score, -2)[-2:]
        if int(drafts[j]) not in top2:
            return j, t


def test_lenient_coupled_verify_fails_the_same_test(bundles, monkeypatch):
    monkeypatch.setattr(rounds_module, "verify_coupled", _lenient_verify)
    b = bundles["self"]
    dec = SpeculativeDecoder(b, strategy="tli", draft_length=4, threads=1)
    samples = sample_tokens(dec, _ids(b), N, 0, SamplingParams(temperature=1.0))
    pvals = check_lossless(dec, b, _ids(b), samples=samples)
    assert pvals["x2"] < ALPHA, pvals
    assert pvals["x1"] > ALPHA          # the first token comes from the prefill: untouched by verify
