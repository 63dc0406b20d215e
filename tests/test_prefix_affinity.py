"""The structural affinity M (calibrate/prefix_affinity.py) on real `tokenizers` tokenizers: a byte-level
BPE target and a SentencePiece-style (▁, byte fallback) drafter, trained fresh (tests/tinymodels.py)."""
from __future__ import annotations

import numpy as np
import pytest

from edgespec.calibrate import prefix_affinity as pa
from edgespec.calibrate.priors import make_estimator
from edgespec.errors import CalibrationError
from edgespec.profiler.study.slrs import SecondStep, segment_counts
from edgespec.runtime.bundle.vocab import build_maps

import tinymodels

N_T, N_D = 608, 512          # model vocabularies larger than the tokenizers' (padding ids have no string)


@pytest.fixture(scope="module")
def pair():
    toks = tinymodels.tiny_tokenizers()
    target, drafter = toks["bytelevel"], toks["spiece"]
    return target, drafter, pa.TokenStructure(target, drafter, N_T, N_D)


def _row(csr, r):
    data, indices, indptr = csr
    return indices[indptr[r]:indptr[r + 1]], data[indptr[r]:indptr[r + 1]]


def test_longest_prefix_on_a_hand_vocabulary():
    vocab = {b"h": 0, b"he": 1, b"hello": 2, b" w": 3}
    got = pa.longest_prefix_ids([b"hello!", b"hel", b"x", None, b" world", b"h"], vocab)
    assert got.tolist() == [2, 1, -1, -1, 3, 0]


def test_first_and_parent_compare_decoded_strings_across_styles(pair):
    target, drafter, s = pair
    d2t, _ = build_maps(target, drafter, N_T, N_D)
    both = np.flatnonzero(d2t >= 0)
    assert both.size > 50
    # a token spelled in both vocabularies ("▁the" and "Ġthe" alike) is its own first target token
    assert all(s.t_keys[s.first[d]] == s.d_keys[d] for d in both)
    spaced = [d for d in both if s.d_keys[d].startswith(b" ")]
    assert any(drafter.id_to_token(int(d)).startswith("\u2581") for d in spaced)
    for d in np.flatnonzero(s.first >= 0):
        key, first = s.d_keys[d], s.t_keys[s.first[d]]
        assert key.startswith(first)
        longer = [t for t in s.t_keys if t and key.startswith(t) and len(t) > len(first)]
        assert not longer                                           # the LONGEST target prefix
    for t in np.flatnonzero(s.parent >= 0):
        assert s.t_keys[t].startswith(s.d_keys[s.parent[t]])
    assert (s.first[N_D - 1], s.parent[N_T - 1]) == (-1, -1)         # padding ids: no string
    # extended: exactly the drafter strings some target token strictly extends
    for d in np.flatnonzero(s.canonical >= 0)[:200]:
        key = s.d_keys[d]
        assert s.extended[d] == any(t and t.startswith(key) and len(t) > len(key) for t in s.t_keys)


def test_prefix_rows_are_stochastic_prefix_related_and_weighted_by_the_prior(pair):
    _, _, s = pair
    prior = np.random.default_rng(0).dirichlet(np.ones(N_T))
    k = 4
    csr = pa.prefix_csr(s, prior, k)
    outside = 0
    for d in np.flatnonzero(s.first >= 0):
        cols, vals = _row(csr, d)
        key = s.d_keys[d]
        assert 1 <= cols.size <= k and vals.sum() == pytest.approx(1.0)
        assert s.first[d] in cols                                   # the lookahead-1 answer is always kept
        for t in cols:
            assert key.startswith(s.t_keys[t]) or s.t_keys[t].startswith(key)
        kids = [t for t in cols if t != s.first[d]]
        if kids:
            np.testing.assert_allclose(vals / vals.sum(), prior[cols] / prior[cols].sum())
        outside += sum(s.d_index.get(s.t_keys[t]) is None for t in cols)
    assert outside > 0                                              # proposes tokens the drafter cannot spell


def test_structural_estimators_through_make_estimator(pair):
    target, drafter, _ = pair
    d2t, _ = build_maps(target, drafter, N_T, N_D)
    est = make_estimator("first", d2t, N_T, tokenizers=(target, drafter))
    (data, indices, indptr), info = est.build(32)
    lengths = np.diff(indptr)
    assert set(lengths.tolist()) <= {0, 1} and np.all(data == 1.0)
    assert info["rows_outside_target_vocab"] > 0                    # drafter tokens outside T get a row too
    pre = make_estimator("prefix", d2t, N_T, tokenizers=(target, drafter))
    rng = np.random.default_rng(1)
    pre.add(rng.dirichlet(np.ones(N_T), size=5))
    (data, indices, indptr), info = pre.build(8)
    assert info["prior_positions"] == 5 and info["entries_outside_drafter_vocab"] > 0
    sums = np.add.reduceat(data, indptr[:-1][np.diff(indptr) > 0])
    np.testing.assert_allclose(sums, 1.0)
    with pytest.raises(CalibrationError, match="tokenizers"):
        make_estimator("prefix", d2t, N_T)


def test_segment_counts_match_lemma_3_3_on_a_complete_vocabulary():
    # every string of length <= 5 over {h,e,l,o} that occurs in "hello": 2^(m-1) sequences spell it
    vocab = {b"hello"[i:j]: 0 for i in range(5) for j in range(i + 1, 6)}
    ways, nodes = segment_counts(b"hello", vocab)
    assert ways == 2 ** 4
    assert nodes == 1 + 1 + 2 + 4 + 8                              # root + proper prefixes' sequences
    assert segment_counts(b"hex", vocab)[0] == 0


def test_second_step_psi_is_a_distribution_and_uses_the_target_tokenizer(pair):
    target, _, s = pair
    second = SecondStep(s, target)
    d1 = int(np.flatnonzero(s.extended & (s.first >= 0))[0])
    q2 = np.random.default_rng(2).dirichlet(np.ones(N_D))
    psi = second.psi(d1, q2, N_T)
    assert psi.sum() == pytest.approx(1.0) and psi.min() >= 0
    checked = 0
    for (a, b), t in list(second.exact.items())[:80]:
        if t < 0:                                                   # bytes that are not UTF-8 text
            continue
        checked += 1
        text = (s.d_keys[a] + (s.d_keys[b] or b"")).decode("utf-8")
        assert t == target.encode(text, add_special_tokens=False).ids[0]
    assert checked > 10


def test_branching_drafter_matches_a_plain_forward(tmp_path):
    """slrs-2's second drafter step (the cached prefix repeated over branches) == running the whole
    prefix + token through the model."""
    import torch

    from edgespec.profiler.study.slrs import BranchingDrafter

    tok = tinymodels.tiny_tokenizers()["spiece"]
    drafter = BranchingDrafter(tinymodels.build_tiny_model(tmp_path / "tiny-sp", tok, "spiece", seed=3))
    ids = np.random.default_rng(4).integers(300, 500, 30)
    drafter.sequence(ids)
    tokens = np.array([300, 301, 450])
    branched = drafter.branches(12, tokens)
    for j, t in enumerate(tokens):
        with torch.no_grad():
            ref = drafter.model(input_ids=torch.as_tensor(np.append(ids[:13], t))[None]).logits[0, -1].numpy()
        np.testing.assert_allclose(branched[j], ref, atol=1e-4)
    with pytest.raises(AssertionError):                              # the check can fail: a wrong prefix
        np.testing.assert_allclose(drafter.branches(11, tokens[:1])[0], branched[0], atol=1e-4)
