"""Randomised drafting on synthetic p, q: Lemma 4.1, Lemma 4.2 (exact), the chain extension (exact)."""
import numpy as np
import pytest
from scipy import stats

from edgespec.runtime.round.randomised import acceptance_rate, chain_length, output_distribution
from edgespec.runtime.samplers.verify import residual, verify_sampled


def _pq(rng, v=12):
    """p and q with partly disjoint supports (as after pruning / TLI)."""
    p = rng.dirichlet(np.full(v, 0.5))
    p[:2] = 0.0
    q = rng.dirichlet(np.full(v, 0.5))
    q[-3:] = 0.0
    return p / p.sum(), q / q.sum()


@pytest.mark.parametrize("a", [0.3, 0.7, 1.0])
def test_accept_probability_is_lemma_4_1(a):
    p, q = _pq(np.random.default_rng(0))
    by_definition = float(np.sum(q * np.minimum(1.0, np.divide(p, a * q, out=np.ones_like(p), where=q > 0))))
    assert acceptance_rate(p, q, a) == pytest.approx(by_definition, abs=1e-12)
    if a == 1.0:                                              # vanilla SD: sum min(p, q)
        assert acceptance_rate(p, q, a) == pytest.approx(np.minimum(p, q).sum(), abs=1e-12)


@pytest.mark.parametrize("a", [0.05, 0.3, 0.7, 1.0])
def test_one_step_outputs_p_exactly(a):
    p, q = _pq(np.random.default_rng(1))
    np.testing.assert_allclose(output_distribution(p, q, a), p, rtol=0, atol=1e-12)


@pytest.mark.parametrize("a", [0.3, 0.7])
def test_chain_of_two_outputs_the_target_law_exactly(a):
    """gamma = 2, one iteration, enumerated exactly: coins, drafts, accept tests and residuals as the
    module docstring describes. Positions left to the next iteration start a fresh chain, whose first
    token has law output_distribution(p2, q2, a)."""
    rng = np.random.default_rng(2)
    v = 6
    p1, q1 = _pq(rng, v)
    p2 = [_pq(rng, v)[0] for _ in range(v)]                   # p2[x1], q2[x1]: conditionals at position 2
    q2 = [_pq(rng, v)[1] for _ in range(v)]
    acc = lambda p, q, x: min(1.0, p[x] / (a * q[x])) if q[x] > 0 else 1.0   # never drafted when q = 0
    joint = np.zeros((v, v))
    r1 = residual(p1, q1, a)
    first_from_residual = (1 - a) * r1 + a * sum(q1[d] * (1 - acc(p1, q1, d)) for d in range(v)) * r1
    for x1 in range(v):                                       # the iteration ended after x1
        joint[x1] += first_from_residual[x1] * output_distribution(p2[x1], q2[x1], a)
    for d1 in range(v):                                       # d1 drafted and accepted
        w = a * q1[d1] * acc(p1, q1, d1)
        if w == 0:
            continue
        r2 = residual(p2[d1], q2[d1], a)
        joint[d1] += w * (1 - a) * r2                         # coin 2: no draft -> residual at 2
        for d2 in range(v):                                   # coin 2: draft d2
            joint[d1, d2] += w * a * q2[d1][d2] * acc(p2[d1], q2[d1], d2)
            joint[d1] += w * a * q2[d1][d2] * (1 - acc(p2[d1], q2[d1], d2)) * r2
    want = p1[:, None] * np.array(p2)
    np.testing.assert_allclose(joint, want, rtol=0, atol=1e-12)


@pytest.mark.parametrize("a", [0.3, 0.7])
def test_verify_randomised_samples_p(a):
    """The coins + verify.verify_sampled (one position) against p: chi-square, 20k draws."""
    rng = np.random.default_rng(3)
    p, q = _pq(rng, 8)
    counts = np.zeros(8)
    for _ in range(20000):
        n, stopped = chain_length(rng, a, 1)
        drafts = [int(rng.choice(8, p=q))] if n else []
        q_rows = np.stack([q, q])[: n + 1] if stopped else q[None]
        accepted, token = verify_sampled(np.stack([p, p])[: n + 1], q_rows, np.array(drafts, dtype=np.int64), rng, a, stopped)
        counts[drafts[0] if accepted else token] += 1
    keep = p > 0
    assert counts[~keep].sum() == 0
    assert stats.chisquare(counts[keep], 20000 * p[keep]).pvalue > 1e-3


def test_broken_residual_fails_the_same_check():
    """Negative control: emitting from p instead of the residual after a no-draft oversamples."""
    rng = np.random.default_rng(4)
    p, q = _pq(rng, 8)
    a, counts = 0.7, np.zeros(8)
    for _ in range(20000):
        if rng.random() < a:
            d = int(rng.choice(8, p=q))
            counts[d if rng.random() * a * q[d] < p[d] else int(rng.choice(8, p=residual(p, q, a)))] += 1
        else:
            counts[int(rng.choice(8, p=p))] += 1               # wrong: should be the residual
    keep = p > 0
    assert stats.chisquare(counts[keep], 20000 * p[keep]).pvalue < 1e-3


# --------------------------------------------------------------------------- through the decode loop

from distribution import ALPHA, REJECTION, check_lossless, sample_tokens  # noqa: E402  (tests/ is on sys.path)
from edgespec.errors import GenerationError  # noqa: E402
from edgespec.runtime import Bundle, SpeculativeDecoder  # noqa: E402
from edgespec.runtime.samplers import verify as verify_module  # noqa: E402
from edgespec.runtime.samplers.sampling import SamplingParams  # noqa: E402

PROMPT = "The quick brown"


@pytest.mark.parametrize("a,concurrent", [(0.3, True), (0.7, True), (0.7, False)])
def test_samples_the_target_distribution(tiny_self_bundle, a, concurrent):
    b = Bundle.load(tiny_self_bundle)
    dec = SpeculativeDecoder(b, strategy="tli", draft_length=4, threads=1, draft_probability=a,
                             options={"concurrent_draft": concurrent, **REJECTION})
    pvals = check_lossless(dec, b, b.target.tokenizer.encode(PROMPT).ids, n=2000, seed=0)
    assert min(pvals.values()) > ALPHA, pvals


def test_emitting_from_p_instead_of_the_residual_fails_the_same_test(tiny_self_bundle, monkeypatch):
    """Negative control: no-draft and rejected positions emit from p instead of norm(max(p - a q, 0))."""
    monkeypatch.setattr(verify_module, "residual", lambda p, q, a=1.0, out=None: p.copy())
    b = Bundle.load(tiny_self_bundle)
    dec = SpeculativeDecoder(b, strategy="tli", draft_length=4, threads=1, draft_probability=0.7,
                             options=REJECTION)
    ids = b.target.tokenizer.encode(PROMPT).ids
    pvals = check_lossless(dec, b, ids, samples=sample_tokens(dec, ids, 2000, 0, SamplingParams(temperature=1.0)))
    assert min(pvals["x2"], pvals["x3|x1x2"]) < ALPHA, pvals


def test_drafts_less_and_accepts_more(tiny_self_bundle):
    b = Bundle.load(tiny_self_bundle)
    rates = {}
    for a in (None, 0.5):
        dec = SpeculativeDecoder(b, strategy="tli", draft_length=4, threads=1, draft_probability=a,
                                 options=REJECTION)
        st = [dec.generate(PROMPT, max_new_tokens=24, temperature=1.0, seed=s).stats for s in range(20)]
        rates[a] = (sum(x.accepted for x in st) / sum(x.drafted for x in st), sum(x.drafted for x in st))
    assert rates[0.5][0] > rates[None][0] and rates[0.5][1] < rates[None][1], rates


def test_greedy_is_ar_and_auto_needs_a_star(tiny_same_bundle):
    b = Bundle.load(tiny_same_bundle)
    ref = SpeculativeDecoder(b, strategy="ar", threads=1).generate(PROMPT, max_new_tokens=20).token_ids
    dec = SpeculativeDecoder(b, strategy="tli", draft_length=3, threads=1, draft_probability=0.5)
    assert dec.generate(PROMPT, max_new_tokens=20).token_ids == ref
    with pytest.raises(GenerationError, match="a\\*"):
        SpeculativeDecoder(b, strategy="tli", draft_probability="auto")
    b.randomised = {"a_star": 0.6, "lambda": 0.3}
    assert SpeculativeDecoder(b, strategy="tli", draft_probability="auto").config.draft_probability == 0.6
