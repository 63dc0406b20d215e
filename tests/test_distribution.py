"""Losslessness at temperature > 0 (harness: tests/distribution.py), with a negative control.

2,000 seeded generations of 3 tokens on the tiny self bundle (drafter = target with a head pruned to
3/4, so about a quarter of the mass must come from the residual) and the tiny same bundle (an
unrelated random drafter: acceptance ~0.2, most tokens come from the residual). Threshold ALPHA=1e-3
per p-value (false-failure rate <= 3e-3 per decoder; deterministic for the fixed seeds)."""
import numpy as np
import pytest

from distribution import ALPHA, REJECTION, check_lossless, sample_tokens, verify_without_residual  # tests/ is on sys.path (conftest.py)
from edgespec.runtime import Bundle, SpeculativeDecoder
from edgespec.runtime.round import rounds as rounds_module
from edgespec.runtime.samplers.sampling import SamplingParams

PROMPT = "The quick brown"
N = 2000


def _ids(bundle):
    return bundle.target.tokenizer.encode(PROMPT).ids


@pytest.mark.parametrize("which,params", [
    ("self", dict(temperature=1.0)),
    ("same", dict(temperature=0.8, top_k=40, top_p=0.9)),
])
def test_tli_samples_the_target_distribution(request, which, params):
    b = Bundle.load(request.getfixturevalue(f"tiny_{which}_bundle"))
    dec = SpeculativeDecoder(b, strategy="tli", draft_length=4, threads=1, options=REJECTION)
    pvals = check_lossless(dec, b, _ids(b), n=N, seed=0, **params)
    assert set(pvals) == {"x1", "x2", "x3|x1x2"}
    assert min(pvals.values()) > ALPHA, pvals


def test_broken_verifier_fails_the_same_test(tiny_self_bundle, monkeypatch):
    monkeypatch.setattr(rounds_module, "verify_sampled", verify_without_residual)
    b = Bundle.load(tiny_self_bundle)
    dec = SpeculativeDecoder(b, strategy="tli", draft_length=4, threads=1, options=REJECTION)
    samples = sample_tokens(dec, _ids(b), N, 0, SamplingParams(temperature=1.0))
    pvals = check_lossless(dec, b, _ids(b), samples=samples)
    assert pvals["x2"] < ALPHA and pvals["x3|x1x2"] < ALPHA, pvals
    assert pvals["x1"] > ALPHA          # the first token comes from the prefill: untouched by verify
