"""draft_length="auto" (the governor), the confidence stop, prompt lookup (`ngram`, `ngram-tli`) and
strategy="auto": greedy identity with `ar`, the target's law at T > 0 (with a negative control), and
one-line errors for bad settings."""
from types import SimpleNamespace

import numpy as np
import pytest

from distribution import ALPHA, REJECTION, check_lossless, sample_tokens  # tests/ is on sys.path (conftest.py)
from edgespec.errors import GenerationError
from edgespec.runtime import Bundle, SpeculativeDecoder
from edgespec.runtime.round import ngram
from edgespec.runtime.round import rounds as rounds_module
from edgespec.runtime.round.governor import Governor
from edgespec.runtime.samplers.lookup import lookup
from edgespec.runtime.samplers.sampling import SamplingParams, sample

PROMPTS = ["The quick brown fox. The quick brown", "def add(a, b):\n    return a + b\n\ndef add(",
           "1, 2, 3, 1, 2, 3, 1,", "Once upon a time"]
CONFIGS = [dict(strategy="ngram"), dict(strategy="ngram-tli"), dict(strategy="tli", draft_length="auto"),
           dict(strategy="tli", draft_confidence=0.5), dict(strategy="auto"), dict(strategy="ngram", draft_length="auto"),
           dict(strategy="slem", draft_length="auto"), dict(strategy="ngram-tli", draft_length="auto")]


@pytest.mark.parametrize("which", ["self", "hetero"])
def test_greedy_output_equals_ar(request, which):
    b = Bundle.load(request.getfixturevalue(f"tiny_{which}_bundle"))
    base = SpeculativeDecoder(b, strategy="tli", threads=1)
    ar = base.variant("ar")
    for cfg in CONFIGS:
        dec = base.variant(**cfg) if "draft_confidence" not in cfg else \
            SpeculativeDecoder(b, strategy=cfg["strategy"], draft_length=4, threads=1,
                               options={"draft_confidence": cfg["draft_confidence"]})
        for p in PROMPTS:
            assert dec.generate(p, max_new_tokens=24).token_ids == ar.generate(p, max_new_tokens=24).token_ids, (cfg, p)


def test_the_governor_falls_back_and_reprobes():
    gov = Governor(4)
    picks = []
    for _ in range(60):                    # drafts that are never accepted; rounds cost more with n
        g = gov.choose(4)
        picks.append(g)
        gov.update(g, 0, 10.0 + 5 * g)
    assert picks[10:].count(0) >= 40 and 1 in picks[10:]  # mostly plain decoding, with probes
    good = Governor(4)
    for _ in range(30):                    # everything accepted, cheap drafts: the longest draft wins
        g = good.choose(4)
        good.update(g, g, 10.0 + g)
    assert good.choose(4) == 4


def test_lookup_finds_the_latest_longest_match():
    h = np.array([5, 1, 2, 3, 9, 1, 2, 3, 7, 8, 1, 2, 3])
    assert lookup(h, 4, 3) == ([7, 8, 1], 3)     # the latest occurrence of [1, 2, 3]
    assert lookup(h, 1, 2) == ([7, 8], 1)
    assert lookup(h, 4, 3, min_n=4) == ([], 0)
    assert lookup(np.array([4, 5, 6]), 4, 3) == ([], 0)


# Ids 20..499 in order: most first tokens occur in it once, followed by their successor, so prompt
# lookup drafts in most samples (a few hundred tokens of prompt, within the tiny models' 512).
LOOKUP_PROMPT = list(range(20, 500))


@pytest.mark.parametrize("cfg, prompt", [
    (dict(strategy="ngram", draft_length=4, options={"ngram_max_n": 1, **REJECTION}), LOOKUP_PROMPT),
    (dict(strategy="ngram-tli", draft_length=4, options={"ngram_max_n": 1, **REJECTION}), LOOKUP_PROMPT),  # lookup, then the drafter
    (dict(strategy="tli", draft_length="auto", options={"draft_confidence": 0.3, **REJECTION}), None),
])
def test_samples_the_target_distribution(tiny_self_bundle, cfg, prompt):
    b = Bundle.load(tiny_self_bundle)
    dec = SpeculativeDecoder(b, threads=1, **cfg)
    ids = prompt or b.target.tokenizer.encode(PROMPTS[0]).ids
    pvals = check_lossless(dec, b, ids, n=2000, seed=0)
    assert min(pvals.values()) > ALPHA, pvals
    if prompt:                                        # the lookup really drafted
        st = dec.generate(ids, max_new_tokens=4, temperature=1.0, seed=1).stats
        assert st.drafted > 0


def _verify_accepting_everything(p, q, drafts, rng, a=1.0, terminal_nodraft=False, work=None):
    return len(drafts), sample(p[len(drafts)], rng)


@pytest.mark.parametrize("strategy", ["ngram", "ngram-tli"])
def test_broken_verifier_fails_with_prompt_lookup(tiny_self_bundle, monkeypatch, strategy):
    """Negative control: the same test catches a verifier that accepts every draft."""
    monkeypatch.setattr(rounds_module, "verify_sampled", _verify_accepting_everything)
    b = Bundle.load(tiny_self_bundle)
    # a fixed draft length: with "auto" the governor may time drafting out, and a control that never
    # drafts cannot fail
    dec = SpeculativeDecoder(b, strategy=strategy, draft_length=4, threads=1,
                             options={"ngram_max_n": 1, **REJECTION})
    samples = sample_tokens(dec, LOOKUP_PROMPT, 2000, 0, SamplingParams(temperature=1.0))
    pvals = check_lossless(dec, b, LOOKUP_PROMPT, samples=samples)
    assert min(pvals["x2"], pvals["x3|x1x2"]) < ALPHA, pvals


@pytest.mark.parametrize("kwargs, match", [
    (dict(strategy="tli", options={"drafter_window": 1}), "drafter_window"),
    (dict(strategy="tli", options={"plain_steps": "quick"}), "plain_steps"),
    (dict(strategy="tli", options={"prefix_reuse": "yes"}), "prefix_reuse"),
    (dict(strategy="ngram", options={"ngram_max_n": 0}), "ngram_max_n"),
    (dict(strategy="ngram", draft_probability=0.5), "token-level"),
    (dict(strategy="slem", draft_probability=0.5), "token-level"),
    (dict(strategy="tli", options={"draft_confidence": 1.5}), "draft_confidence"),
    (dict(strategy="tli", draft_length="often"), "draft_length"),
])
def test_bad_settings(tiny_self_bundle, kwargs, match):
    with pytest.raises(GenerationError, match=match):
        SpeculativeDecoder(tiny_self_bundle, threads=1, **kwargs)


def test_ar_takes_the_default_auto_draft_length_and_drafts_nothing(tiny_self_bundle):
    dec = SpeculativeDecoder(tiny_self_bundle, strategy="ar", threads=1)        # draft_length="auto" by default
    st = dec.generate(PROMPTS[3], max_new_tokens=6).stats
    assert st.drafted == 0 and st.draft_forwards == 0 and st.verify_forwards == st.new_tokens - 1


def test_auto_picks_slem_for_a_hetero_pair_and_ngram_tli_for_a_shared_tokenizer(tiny_hetero_bundle, tiny_self_bundle):
    het = SpeculativeDecoder(tiny_hetero_bundle, threads=1)
    assert het.generate(PROMPTS[3], max_new_tokens=4).stats.strategy == "slem"
    assert het.generate(PROMPTS[3], max_new_tokens=4, temperature=1.0, seed=0).stats.strategy == "slem"
    same = SpeculativeDecoder(tiny_self_bundle, threads=1)
    assert same.generate(PROMPTS[3], max_new_tokens=4).stats.strategy == "ngram-tli"


def test_auto_stats(tiny_self_bundle):
    dec = SpeculativeDecoder(tiny_self_bundle, strategy="tli", draft_length="auto", threads=1,
                             options={"max_draft_length": 5})
    st = dec.generate(PROMPTS[0], max_new_tokens=32).stats
    d = st.to_dict()
    assert d["draft_length_setting"] == "auto" and 0 <= d["draft_length"] <= 5
    assert len(st.gamma_per_step) == st.verify_forwards and max(st.gamma_per_step) <= 5
    assert d["zero_accept_share"] is None or 0 <= d["zero_accept_share"] <= 1
    assert all(a is None or 0 <= a <= 1 for a in d["acceptance_by_position"])


def test_the_governor_respects_a_shrinking_limit():
    gov = Governor(6)
    for _ in range(20):
        g = gov.choose(6)
        gov.update(g, g, 10.0 + g)
    assert gov.choose(6) >= 2
    assert [gov.choose(k) for k in (1, 0, 1)] == [1, 0, 1]   # near max_new_tokens


def test_ngram_tli_auto_keeps_one_governor_per_proposer(tiny_self_bundle):
    dec = SpeculativeDecoder(tiny_self_bundle, strategy="ngram-tli", draft_length="auto", threads=1)
    ar = dec.variant("ar")
    prompt = PROMPTS[1] + "\n" + PROMPTS[3]      # a repeat to look up, and text with none
    assert dec.generate(prompt, max_new_tokens=40).token_ids == ar.generate(prompt, max_new_tokens=40).token_ids
    assert set(dec.setup.source_governors) <= {"ngram", "drafter"} and dec.setup.source_governors
    assert dec.setup.governor_for(None) is dec.setup.governor and dec.setup.governor_for("ngram") is dec.setup.governor_for("ngram")
    assert SpeculativeDecoder(tiny_self_bundle, strategy="ngram-tli", draft_length=4, threads=1).setup.governor_for("ngram") is None


def test_ngram_tli_switches_between_lookup_and_drafter_mode():
    # history ends in 9; 9 occurred once before (followed by 4): a 1-token match only
    gen = SimpleNamespace(config=SimpleNamespace(gamma=3, options={}), prompt_ids=[9, 4, 5, 6, 7, 9], generated=[], lookup_max_n=4, lookup_view=None,
                          shared=SimpleNamespace(answers=None), draft_scope=None,     # no answer store
                          drafter=object())
    state = ngram.start(gen)

    def source():
        state.begin_round(gen)
        return ngram.source(state)
    assert source() == "ngram" and state.found == [4, 5, 6]                 # lookup mode takes a 1-token match
    rate = state.hit_rate
    assert ngram.source(state) == "ngram" and state.hit_rate == rate        # source only reads the state
    gen.prompt_ids = [1, 2, 3]                                               # no match at all
    assert source() == "ngram" and state.found == [] and state.plain       # a plain step, no drafter
    while state.hit_rate >= ngram.LOOKUP_MODE:
        source()
    assert source() == "drafter" and not state.plain                        # matches are rare: the drafter
    gen.prompt_ids = [9, 4, 5, 6, 7, 9]
    assert source() == "drafter"                                            # a 1-token match is not enough now
    gen.prompt_ids = [8, 9, 4, 5, 6, 8, 9]
    assert source() == "ngram" and state.found == [4, 5, 6]                 # a 2-token match is
    gen.drafter, gen.prompt_ids = None, [9, 4, 5, 6, 7, 9]                  # plain ngram: lookup only, no mode
    plain = ngram.start(gen)
    plain.begin_round(gen)
    assert plain.found == [4, 5, 6] and plain.hit_rate == 1.0 and not plain.plain
