"""Reusable harness: does a decoder sample from the target's distribution? (losslessness at T > 0)

    from distribution import check_lossless
    pvals = check_lossless(decoder, bundle, prompt_ids, n=2000, seed=0)   # {"x1": p, "x2": p, "x3|x1x2": p}
    assert min(pvals.values()) > ALPHA

What is tested, from `n` independent generations of 4 tokens (seeds seed..seed+n-1):
- "x1", "x2": the empirical marginal of the 1st and 2nd generated token against the exact target
  marginals P(x1) = p(x1 | prompt) and P(x2) = sum_x1 P(x1) p(x2 | prompt, x1), computed with the
  target alone (one ORT forward per x1 with P(x1) >= 1e-9; the skipped mass bounds the error).
  Pearson chi-square over every token with expected count >= 5, plus one "other" bucket (and an
  "ended" bucket for EOS).
- "x3|x1x2": the 3rd token *given the actual history* of each sample, by the randomised probability
  integral transform: u = F(x3-) + v p(x3) with v ~ U(0,1) and F the CDF of p(. | prompt, x1, x2) in
  token-id order, which is exactly U(0,1) under the null; chi-square over 20 equal bins.
  x1 comes from the target's prefill; with 4 new tokens and a draft length >= 2 the first round
  drafts 2 tokens, so x2 and x3 come from one speculative block (draft positions 1 and 2: a
  rejection, an accepted draft or the residual), and the chain, not just its first step, is checked.

The p-values are exact-ish (asymptotic chi-square; every expected count >= 5). With the threshold
ALPHA = 1e-3 a correct decoder fails one p-value with probability <= 1e-3, i.e. a check of 3 p-values
fails falsely with probability <= 3e-3; the seed is fixed, so a given run is deterministic.
"""
from __future__ import annotations

import numpy as np
from scipy import stats as sst

from edgespec.runtime.engine.kv import ModelRunner
from edgespec.runtime.samplers.sampling import SamplingParams, probabilities, sample
from edgespec.runtime.engine.sessions import create_session

ALPHA = 1e-3
# seeded generations sample coupled (runtime/samplers/coupled.py); tests of rejection sampling ask for it
REJECTION = {"coupled_sampling": False}
MIN_EXPECTED = 5.0
MIN_BRANCH_PROB = 1e-9


class TargetOracle:
    """Exact next-token distributions of the bundle's target (its own 1-thread session; with
    `prefill_graph`, long forwards on the target's prefill graph, as SpeculativeDecoder(prefill_graph=True))."""

    def __init__(self, bundle, params: SamplingParams, prefill_graph: bool = False, ep: str = "cpu"):
        sess, _ = create_session(bundle.target.onnx, ep, threads=1, role="oracle")
        twin = create_session(bundle.target.prefill_onnx, "cpu", threads=1, role="oracle")[0] if prefill_graph else None
        self.runner = ModelRunner(sess, "oracle", prefill_session=twin)
        self.params = params
        self.vocab = bundle.target.vocab_size
        self.eos = set(bundle.target.eos_ids)

    def next_probs(self, prefix: list[int], tail: tuple = ()) -> np.ndarray:
        """After prefix (one forward, as a prompt's prefill) and then tail (one more forward)."""
        self.runner.reset()
        logits = self.runner.forward(prefix)[-1:]
        if tail:
            logits = self.runner.forward(list(tail))[-1:]
        return self.probs(logits, tuple(tail))

    def probs(self, logits: np.ndarray, generated: tuple) -> np.ndarray:
        """The law of the next token from the target's logits after `generated` (a subclass may constrain it)."""
        return probabilities(logits, self.params)[0]

    def marginals(self, prompt_ids: list[int]) -> tuple[np.ndarray, np.ndarray]:
        """(P(x1), P(x2)) over V + 1 categories, the last being "generation ended" (EOS before)."""
        v = self.vocab
        p1 = np.zeros(v + 1)
        p1[:v] = self.next_probs(prompt_ids)
        p2 = np.zeros(v + 1)
        self.runner.reset()
        self.runner.forward(prompt_ids)
        base = self.runner.length
        for x1 in np.flatnonzero(p1[:v] >= MIN_BRANCH_PROB):
            if int(x1) in self.eos:
                p2[v] += p1[x1]
                continue
            self.runner.crop(base)
            p2[:v] += p1[x1] * self.probs(self.runner.forward([int(x1)]), (int(x1),))
        p2 /= p2.sum()
        return p1, p2


def chisquare_pvalue(observed: np.ndarray, probs: np.ndarray) -> tuple[float, int]:
    """Pearson chi-square of category samples against probs: categories with expected count >= 5,
    the rest pooled into one "other" bucket (dropped if its expectation is < 5)."""
    n = observed.size
    counts = np.bincount(observed, minlength=probs.size).astype(np.float64)
    expected = probs * n
    big = expected >= MIN_EXPECTED
    obs = list(counts[big])
    exp = list(expected[big])
    rest_e, rest_o = expected[~big].sum(), counts[~big].sum()
    if rest_e >= MIN_EXPECTED:
        obs.append(rest_o)
        exp.append(rest_e)
    elif rest_o > 0 and rest_e == 0:
        return 0.0, len(obs)           # samples where the target has probability 0
    exp = np.asarray(exp)
    exp *= np.sum(obs) / exp.sum()
    res = sst.chisquare(np.asarray(obs), exp)
    return float(res.pvalue), len(obs) - 1


def pit_pvalue(u: np.ndarray, bins: int = 20) -> float:
    counts = np.histogram(u, bins=bins, range=(0.0, 1.0))[0]
    return float(sst.chisquare(counts).pvalue)


def sample_tokens(decoder, prompt_ids: list[int], n: int, seed: int, params: SamplingParams,
                  max_new_tokens: int = 4, **generate_kwargs) -> np.ndarray:
    """[n, max_new_tokens] generated ids, -1 after an early EOS."""
    out = np.full((n, max_new_tokens), -1, dtype=np.int64)
    for i in range(n):
        r = decoder.generate(prompt_ids, max_new_tokens=max_new_tokens, temperature=params.temperature,
                             top_k=params.top_k, top_p=params.top_p, seed=seed + i, **generate_kwargs)
        out[i, :len(r.token_ids)] = r.token_ids
    return out


def check_lossless(decoder, bundle, prompt_ids: list[int], n: int = 2000, seed: int = 0,
                   temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None,
                   samples: np.ndarray | None = None, prefill_graph: bool = False, oracle=None, ep: str = "cpu",
                   **generate_kwargs) -> dict:
    """p-values {"x1", "x2", "x3|x1x2"} for `decoder` on `prompt_ids` (module docstring). `oracle`: the
    exact distributions to test against (default: the target's on the decoder's EP `ep`, TargetOracle);
    `generate_kwargs` go to every generate call (e.g. a grammar, with a constrained oracle)."""
    params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p)
    oracle = oracle or TargetOracle(bundle, params, prefill_graph, ep)
    toks = samples if samples is not None else sample_tokens(decoder, prompt_ids, n, seed, params, **generate_kwargs)
    v = oracle.vocab
    p1, p2 = oracle.marginals(prompt_ids)
    x1 = toks[:, 0]
    x2 = np.where(toks[:, 1] >= 0, toks[:, 1], v)
    out = {"x1": chisquare_pvalue(x1, p1)[0], "x2": chisquare_pvalue(x2, p2)[0]}
    # x3 given the history: randomised PIT in token-id order
    rng = np.random.default_rng(seed + 10**6)
    u = []
    cache: dict[tuple[int, int], np.ndarray] = {}
    for a, b, c in toks[:, :3]:
        if c < 0:
            continue
        key = (int(a), int(b))
        if key not in cache:
            cache[key] = np.cumsum(oracle.next_probs(list(prompt_ids), key))
        cdf = cache[key]
        lo = cdf[c - 1] if c > 0 else 0.0
        u.append(lo + rng.random() * (cdf[c] - lo))
    if len(u) >= 20 * MIN_EXPECTED:
        out["x3|x1x2"] = pit_pvalue(np.asarray(u))
    return out


def verify_without_residual(p, q, drafts, rng, a=1.0, terminal_nodraft=False, work=None):
    """A deliberately broken verifier: on rejection it resamples from p instead of norm(max(p - q, 0))."""
    n = len(drafts)
    rows = np.arange(n)
    ok = rng.random(n) * q[rows, drafts] < p[rows, drafts]
    n_acc = n if ok.all() else int(np.argmin(ok))
    return n_acc, sample(p[n_acc], rng)
