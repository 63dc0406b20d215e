"""Smoke test for the shared tiny fixtures (tests/conftest.py)."""
import numpy as np

from edgespec.runtime import Bundle


def test_tiny_bundles_load(tiny_same_bundle, tiny_self_bundle, tiny_hetero_bundle, tiny_tokenizers):
    for path in (tiny_same_bundle, tiny_self_bundle, tiny_hetero_bundle):
        b = Bundle.load(path)
        assert b.kept == b.index_map.shape[0] == b.draft_ids.shape[0]
        assert b.manifest["checks"]["pruned_vs_full_max_abs_diff"] == 0.0
    assert Bundle.load(tiny_self_bundle).same_tokenizer
    assert not Bundle.load(tiny_hetero_bundle).same_tokenizer
    assert set(tiny_tokenizers) == {"bytelevel", "spiece"}
    assert np.all(Bundle.load(tiny_self_bundle).index_map == Bundle.load(tiny_self_bundle).draft_ids)
