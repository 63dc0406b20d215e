"""Constrained sampling preserves the constrained target distribution (harness: tests/distribution.py),
with a negative control that must fail.

The law under a grammar: p_G(x | h) = p(x | h) 1[x allowed after h] / Z, after temperature/top-k/top-p
(the mask sets forbidden logits to -inf before sampling.probabilities). The oracle below computes it
with the target alone and a fresh matcher per history; 2,000 seeded generations of 4 tokens with a
draft length of 4 on the tiny self bundle, so x2 and x3 come from one speculative block whose drafts
were drawn from the drafter's q restricted to the grammar (rounds.draft_tokens, generation.Generation.draft_q, grammar.mask_distribution)."""
import numpy as np
import pytest

from distribution import ALPHA, REJECTION, TargetOracle, check_lossless, sample_tokens  # tests/ is on sys.path
from edgespec.runtime import Bundle, SpeculativeDecoder
from edgespec.runtime.api import generation as generation_module
from edgespec.runtime.samplers.grammar import GrammarTokenizer, constraint_from, mask_logits
from edgespec.runtime.samplers.sampling import SamplingParams, probabilities

pytest.importorskip("llguidance")

PROMPT = "The quick brown"
N = 2000
# no forced tokens anywhere (every position has a choice), a quarter or so of the tiny vocabulary allowed
CONSTRAINT = dict(regex=r"[a-m ]+")


class ConstrainedOracle(TargetOracle):
    """Exact next-token distributions of the target under the grammar."""

    def __init__(self, bundle, params, **constraint):
        super().__init__(bundle, params)
        t = bundle.target
        self.tok = GrammarTokenizer(t.tokenizer, t.vocab_size, t.eos_ids)
        self.constraint = constraint_from(**constraint)

    def allowed_after(self, generated) -> np.ndarray:
        state = self.tok.start(self.constraint)
        for x in generated:
            state.commit(0, int(x))
        return state.allowed()

    def probs(self, logits, generated) -> np.ndarray:
        return probabilities(mask_logits(logits, [self.allowed_after(generated)]), self.params)[0]


def _setup(bundle_path, params):
    b = Bundle.load(bundle_path)
    dec = SpeculativeDecoder(b, strategy="tli", draft_length=4, threads=1, options=REJECTION)
    return b, dec, b.target.tokenizer.encode(PROMPT).ids, ConstrainedOracle(b, params, **CONSTRAINT)


@pytest.mark.parametrize("params", [dict(temperature=1.0), dict(temperature=0.8, top_k=40, top_p=0.9)])
def test_constrained_sampling_preserves_the_constrained_target_distribution(tiny_self_bundle, params):
    b, dec, ids, oracle = _setup(tiny_self_bundle, SamplingParams(**params))
    samples = sample_tokens(dec, ids, N, 0, SamplingParams(**params), **CONSTRAINT)
    text = [b.target.tokenizer.decode([int(t) for t in row if t >= 0]) for row in samples[:50]]
    assert all(set(t) <= set("abcdefghijklm ") for t in text), text[:5]
    pvals = check_lossless(dec, b, ids, samples=samples, oracle=oracle, **params)
    assert set(pvals) == {"x1", "x2", "x3|x1x2"}
    assert min(pvals.values()) > ALPHA, pvals
    # the target alone, unconstrained, is not what was sampled (the test can tell the two laws apart)
    plain = check_lossless(dec, b, ids, samples=samples, **params)
    assert plain["x1"] < ALPHA, plain


def _unnormalised_q(q, allowed):
    """A broken drafter mask: the draft is drawn from q restricted to the grammar, but verify is handed
    the unrestricted q (the row is left as it was), so it under-states the draft's probability."""
    masked = np.where(allowed[:q.shape[0]], q, 0.0)
    mass = masked.sum()
    return masked / mass if mass > 0 else None


def test_unrenormalised_draft_mask_fails_the_same_test(tiny_self_bundle, monkeypatch):
    monkeypatch.setattr(generation_module, "mask_distribution", _unnormalised_q)
    params = SamplingParams(temperature=1.0)
    b, dec, ids, oracle = _setup(tiny_self_bundle, params)
    samples = sample_tokens(dec, ids, N, 0, params, **CONSTRAINT)
    pvals = check_lossless(dec, b, ids, samples=samples, oracle=oracle)
    assert pvals["x2"] < ALPHA or pvals["x3|x1x2"] < ALPHA, pvals
    assert pvals["x1"] > ALPHA          # the first token comes from the prefill: untouched by verify
