"""A plain step's lookup guess (runtime/round/rounds.py `plain_step`, `plain_guess`): where the target pads a
1-token step to 2 (int8-activation graphs), the pad position carries a prompt-lookup guess. Greedy output
stays identical to `ar`, sampling keeps the target's distribution (with a negative control), and it is
off wherever there is no pad to fill. Tiny int4 bundle (min_forward_tokens 2)."""
import numpy as np
import pytest

from distribution import ALPHA, REJECTION, check_lossless, sample_tokens  # tests/ is on sys.path (conftest.py)
from edgespec.errors import GenerationError
from edgespec.runtime import Bundle, SpeculativeDecoder
from edgespec.runtime.round import governor as governor_module
from edgespec.runtime.round import rounds as rounds_module
from edgespec.runtime.round.governor import PROBE_UP, Governor
from edgespec.runtime.samplers.sampling import SamplingParams

PROMPT = "def add(a, b):\n    return a + b\n\ndef add(a, b):\n    return a + b\n\ndef add("


@pytest.fixture
def plain_only(monkeypatch):
    """Every round of draft_length="auto" is a plain step (the governor always chooses gamma = 0)."""
    monkeypatch.setattr(governor_module.Governor, "choose", lambda self, limit: 0)


@pytest.fixture(scope="module")
def int4(tiny_int4_bundle):
    b = Bundle.load(tiny_int4_bundle)
    # the prompt's guesses alone, none from earlier answers (answer_store.py)
    dec = SpeculativeDecoder(b, strategy="tli", draft_length="auto", threads=1,
                             options={"defer_drafter": False, "answer_store_mb": 0, **REJECTION})
    assert dec.target.min_tokens == 2, "the tiny int4 target must pad 1-token steps for these tests"
    return b, dec


def _guesser(monkeypatch, pick):
    """Replace the prompt lookup of plain steps: pick(history) -> the guessed token."""
    monkeypatch.setattr(rounds_module, "lookup", lambda history, max_n, gamma, min_n=1, view=None: ([int(pick(history))], 1))


def test_plain_steps_guess_with_the_real_lookup_and_stay_identical_to_ar(int4, plain_only):
    b, dec = int4
    ar = dec.variant("ar").generate(PROMPT, max_new_tokens=40)
    res = dec.generate(PROMPT, max_new_tokens=40)
    st = res.stats
    assert res.token_ids == ar.token_ids
    assert st.drafted == 0 and set(st.gamma_per_step) == {0} and st.guesses > 0
    assert st.verify_forwards == len(res.token_ids) - 1 - st.guesses_accepted      # a kept guess saves a step
    assert len(st.drafted_per_step) == len(st.gamma_per_step) == st.verify_forwards
    off = dec.variant(plain_guess=False).generate(PROMPT, max_new_tokens=40)
    assert off.token_ids == ar.token_ids and off.stats.guesses == 0
    assert off.stats.verify_forwards == len(ar.token_ids) - 1


@pytest.mark.parametrize("right", [True, False])
def test_kept_and_rejected_guesses_commit_exactly(int4, plain_only, monkeypatch, right):
    """A guesser that is always right (ar's next token) or always wrong: the output is ar's either way; kept
    guesses halve the target steps, and the KV after a kept guess is the one the next steps need."""
    b, dec = int4
    ids = dec.encode_prompt(PROMPT)
    ar = dec.variant("ar").generate(ids, max_new_tokens=41).token_ids
    full = ids + ar
    _guesser(monkeypatch, lambda h: full[len(h)] if right else (full[len(h)] + 1) % b.target.vocab_size)
    res = dec.generate(ids, max_new_tokens=41)
    st = res.stats
    assert res.token_ids == ar
    assert st.guesses_accepted == (20 if right else 0) and st.guesses == (20 if right else 39)
    assert st.verify_forwards == (20 if right else 40) and st.tau == (2.0 if right else 1.0)


def test_auto_with_guesses_equals_ar(int4):
    b, dec = int4
    auto = dec.variant("auto")
    for prompt in (PROMPT, "The quick brown fox"):
        assert auto.generate(prompt, max_new_tokens=48).token_ids == dec.variant("ar").generate(
            prompt, max_new_tokens=48).token_ids


def test_ar_and_randomised_drafting_never_guess(int4, plain_only):
    b, dec = int4
    assert dec.variant("ar").generate(PROMPT, max_new_tokens=24).stats.guesses == 0          # the reference
    assert dec.variant(draft_probability=0.5).generate(PROMPT, max_new_tokens=24, temperature=1.0,
                                                      seed=1).stats.guesses == 0


def test_the_last_token_of_the_budget_is_not_guessed(int4, plain_only):
    b, dec = int4
    res = dec.generate(PROMPT, max_new_tokens=2)
    assert len(res.token_ids) == 2 and res.stats.guesses == 0


def test_plain_guess_is_a_flag(int4):
    b, dec = int4
    with pytest.raises(GenerationError, match="plain_guess must be True or False") as e:
        SpeculativeDecoder(b, threads=1, options={"plain_guess": "yes"})
    assert "\n" not in str(e.value)


def test_the_governor_guesses_while_a_guess_pays_for_its_wider_forward():
    gov = Governor(4)
    assert gov.guess_pays()                              # nothing measured: guess
    for _ in range(PROBE_UP):
        gov.update(0, 0, 12.0, guess_kept=0)
    assert not gov.guess_pays()                          # a plain step's cost is unknown: measure one
    gov.update(0, 0, 10.0)
    assert not gov.guess_pays()                          # 20% dearer, never kept
    for _ in range(PROBE_UP - 2):
        gov.update(0, 0, 10.0)
    assert not gov.guess_pays()
    gov.update(0, 0, 10.0)
    assert gov.guess_pays()                              # a re-probe after PROBE_UP plain steps
    for _ in range(40):
        gov.update(0, 0, 12.0, guess_kept=1)             # kept every time: worth 20% more time
    assert gov.guess_pays()


def test_the_governor_counts_kept_guesses_in_a_plain_step():
    gov = Governor(4)
    for _ in range(10):
        gov.update(0, 0, 10.0, guess_kept=1)
        gov.update(1, 0, 12.0)
    with_guesses = gov.rates(1)
    plain = Governor(4)
    for _ in range(10):
        plain.update(0, 0, 10.0, guess_kept=0)
        plain.update(1, 0, 12.0)
    assert with_guesses[0] > 1.8 / 10.0 and plain.rates(1)[0] == pytest.approx(1.0 / 10.0)
    assert with_guesses[1] == pytest.approx(plain.rates(1)[1])        # a drafting round is unaffected


# --------------------------------------------------------------------------- sampling: the target's law

N = 2000


def _likely_guesser(b, params: SamplingParams):
    """A guess the target often samples: its most likely next token (an oracle, cached per history)."""
    from distribution import TargetOracle
    oracle, cache = TargetOracle(b, params), {}

    def pick(history):
        key = tuple(int(x) for x in history)
        if key not in cache:
            cache[key] = int(np.argmax(oracle.next_probs(list(key))))
        return cache[key]
    return pick


PARAMS = SamplingParams(temperature=0.5)


def test_guessed_plain_steps_sample_the_target_distribution(int4, plain_only, monkeypatch):
    b, dec = int4
    ids = dec.encode_prompt(PROMPT)
    pick = _likely_guesser(b, PARAMS)
    _guesser(monkeypatch, pick)
    samples = sample_tokens(dec, ids, N, 0, PARAMS)
    pvals = check_lossless(dec, b, ids, samples=samples, temperature=PARAMS.temperature)
    assert min(pvals.values()) > ALPHA, pvals
    guessed = np.mean([s[1] == pick(ids + [int(s[0])]) for s in samples])
    assert guessed > 0.2, f"x2 was the guess in only {guessed:.2f} of the runs: too few for the test to mean anything"


def _accept_without_residual(p, q, drafts, rng, a=1.0, terminal_nodraft=False, work=None):
    """A deliberately broken verifier: a rejected guess is followed by a draw from p, not p without it."""
    n_acc = 1 if len(drafts) and rng.random() < p[0, drafts[0]] else 0
    return n_acc, int(rng.choice(p.shape[1], p=p[n_acc] / p[n_acc].sum()))


def test_a_broken_guess_verifier_fails_the_same_test(int4, plain_only, monkeypatch):
    b, dec = int4
    ids = dec.encode_prompt(PROMPT)
    _guesser(monkeypatch, _likely_guesser(b, PARAMS))
    monkeypatch.setattr(rounds_module, "verify_sampled", _accept_without_residual)
    samples = sample_tokens(dec, ids, N, 0, PARAMS)
    pvals = check_lossless(dec, b, ids, samples=samples, temperature=PARAMS.temperature)
    assert pvals["x2"] < ALPHA, pvals
    assert pvals["x1"] > ALPHA          # the first token comes from the prefill: untouched by verify
