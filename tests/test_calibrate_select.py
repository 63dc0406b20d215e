"""Kept-vocabulary policies, coverage, and the vocab.json tokenizer check (edgespec.calibrate.select)."""
from __future__ import annotations

import json

import numpy as np
import pytest

from edgespec.calibrate import select as sel
from edgespec.errors import CalibrationError

COUNTS = np.array([5, 0, 9, 9, 1, 3, 0, 7, 2, 9], dtype=np.float64)   # total 45


def test_ranking_breaks_ties_by_lower_id():
    assert sel.ranking(COUNTS).tolist() == [2, 3, 9, 7, 0, 5, 8, 4, 1, 6]


def test_keep_takes_top_k_plus_always_kept():
    s = sel.select(COUNTS, "keep", 4, always=[6])
    assert s.kept_ids.tolist() == [2, 3, 6, 9]          # 6 forced in, then the three 9s (ids 2, 3, 9)
    assert s.coverage == pytest.approx(27 / 45)
    assert s.n_always == 1


def test_keep_is_deterministic_under_ties():
    s1 = sel.select(COUNTS, "keep", 2, always=[])
    s2 = sel.select(COUNTS.copy(), "keep", 2, always=[])
    assert s1.kept_ids.tolist() == s2.kept_ids.tolist() == [2, 3]


def test_keep_fills_with_zero_count_tokens_by_id():
    s = sel.select(COUNTS, "keep", 10, always=[])
    assert s.kept_ids.tolist() == list(range(10))
    assert s.coverage == 1.0


def test_coverage_is_the_shortest_prefix_reaching_p():
    s = sel.select(COUNTS, "coverage", 0.6, always=[])     # 27/45 = 0.6 exactly with the three 9s
    assert s.kept_ids.tolist() == [2, 3, 9]
    assert s.coverage >= 0.6
    s = sel.select(COUNTS, "coverage", 0.61, always=[])
    assert s.kept_ids.tolist() == [2, 3, 7, 9]
    # brute force: no shorter prefix of the ranking reaches P
    for p in np.linspace(0.05, 1.0, 20):
        s = sel.select(COUNTS, "coverage", p, always=[])
        order = sel.ranking(COUNTS)
        n = s.kept_ids.size
        assert COUNTS[order[:n]].sum() / 45 >= p - 1e-12
        assert n == 1 or COUNTS[order[: n - 1]].sum() / 45 < p


def test_coverage_counts_always_kept_mass():
    s = sel.select(COUNTS, "coverage", 0.2, always=[0])    # token 0 holds 5/45; one 9 more reaches 14/45
    assert s.kept_ids.tolist() == [0, 2]


def test_min_count():
    s = sel.select(COUNTS, "min-count", 7, always=[1])
    assert s.kept_ids.tolist() == [1, 2, 3, 7, 9]
    assert s.coverage == pytest.approx(34 / 45)


@pytest.mark.parametrize("policy,value,match", [
    ("keep", 0, "out of range"), ("keep", 11, "out of range"), ("keep", 2.5, "integer"),
    ("keep", 1, "smaller than the 2 special"),
    ("coverage", 0.0, r"\(0, 1\]"), ("coverage", 1.5, r"\(0, 1\]"), ("coverage", -0.1, r"\(0, 1\]"),
    ("min-count", 0, "positive"), ("frequency", 3, "unknown policy"),
])
def test_out_of_range_policy_values(policy, value, match):
    with pytest.raises(CalibrationError, match=match):
        sel.select(COUNTS, policy, value, always=[0, 1])


def test_all_zero_counts_is_an_empty_corpus():
    with pytest.raises(CalibrationError, match="empty corpus"):
        sel.select(np.zeros(10), "keep", 3, always=[])


def test_coverage_curve_is_monotone_and_ends_at_one():
    ks = sel.curve_points(COUNTS.size)
    cov = sel.coverage_curve(COUNTS, ks)
    assert ks[0] == 1 and ks[-1] == COUNTS.size
    assert np.all(np.diff(cov) >= 0) and cov[-1] == pytest.approx(1.0)
    assert cov[0] == pytest.approx(9 / 45)


def test_heldout_curve_uses_calibration_ranking():
    held = np.zeros(10)
    held[4] = 1.0                                            # only token 4, ranked 8th by COUNTS
    cov = sel.coverage_curve(held, np.array([7, 8]), order=sel.ranking(COUNTS))
    assert cov.tolist() == [0.0, 1.0]


def test_vocab_document_and_wrong_tokenizer(tmp_path, tiny_tokenizers):
    from edgespec.runtime.bundle.vocab import vocab_hash

    bl, sp = tiny_tokenizers["bytelevel"], tiny_tokenizers["spiece"]
    s = sel.select(COUNTS, "keep", 4, always=[0])
    doc = sel.vocab_document(s, vocab_hash(bl), 10, {"source": "raw"}, None)
    path = tmp_path / "v.json"
    path.write_text(json.dumps(doc))
    assert sel.read_vocab(path, bl)["kept_ids"] == [0, 2, 3, 9]
    with pytest.raises(CalibrationError, match="another tokenizer"):
        sel.read_vocab(path, sp)


def test_read_vocab_rejects_bad_files(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(CalibrationError, match="not valid JSON"):
        sel.read_vocab(bad)
    bad.write_text(json.dumps({"format": "edgespec-vocab", "format_version": 1, "kept_ids": [3, 1]}))
    with pytest.raises(CalibrationError, match="ascending"):
        sel.read_vocab(bad)
    with pytest.raises(CalibrationError, match="cannot read"):
        sel.read_vocab(tmp_path / "missing.json")
