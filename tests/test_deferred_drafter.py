"""SpeculativeDecoder(defer_drafter=True), the CPU default: the drafter's session is built at the first
drafting round (runtime/engine/kv.py DeferredRunner), after the first token, and the tokens do not change."""
import pytest

from edgespec.runtime import SpeculativeDecoder
from edgespec.runtime.engine.kv import DeferredRunner, ModelRunner
from edgespec.runtime.engine.sessions import is_cpu_only

PROMPT = "the quick brown fox"


def test_first_token_needs_no_drafter_session(tiny_same_bundle):
    dec = SpeculativeDecoder(tiny_same_bundle, strategy="tli", draft_length=3, threads=1)
    assert isinstance(dec.drafter, DeferredRunner) and dec.drafter.pending
    assert dec.drafter_session_info is None
    assert dec.providers["drafter"] == ["CPUExecutionProvider"]
    one = dec.generate(PROMPT, max_new_tokens=1)          # prefill only: the drafter is not needed
    assert dec.drafter.pending and one.stats.drafter_load_ms == 0
    assert dec.drafter.length == 0 and dec.drafter.tokens_fed == 0
    first = dec.generate(PROMPT, max_new_tokens=24)
    assert not dec.drafter.pending and first.stats.drafter_load_ms > 0
    assert dec.drafter_session_info.active == ["CPUExecutionProvider"]
    again = dec.generate(PROMPT, max_new_tokens=24)
    assert again.stats.drafter_load_ms == 0 and again.token_ids == first.token_ids
    assert first.stats.overhead_ms < first.stats.total_ms - first.stats.drafter_load_ms + 1e-6


@pytest.mark.parametrize("strategy", ["tli", "auto", "ngram-tli"])
def test_deferred_and_eager_drafters_give_ar_tokens(tiny_same_bundle, strategy):
    ar = SpeculativeDecoder(tiny_same_bundle, strategy="ar", threads=1).generate(PROMPT, max_new_tokens=32).token_ids
    eager = SpeculativeDecoder(tiny_same_bundle, strategy=strategy, threads=1, options={"defer_drafter": False})
    assert isinstance(eager.drafter, ModelRunner) and not eager.drafter.pending
    assert eager.drafter_session_info is not None
    deferred = SpeculativeDecoder(tiny_same_bundle, strategy=strategy, threads=1)
    assert eager.generate(PROMPT, max_new_tokens=32).token_ids == ar
    assert deferred.generate(PROMPT, max_new_tokens=32).token_ids == ar


def test_variants_share_one_deferred_build(tiny_same_bundle):
    dec = SpeculativeDecoder(tiny_same_bundle, strategy="tli", draft_length=2, threads=1)
    k4 = dec.variant(draft_length=4)
    assert k4.drafter is dec.drafter and dec.drafter.pending
    assert k4.generate(PROMPT, max_new_tokens=16).stats.drafter_load_ms > 0
    assert not dec.drafter.pending
    assert dec.generate(PROMPT, max_new_tokens=16).stats.drafter_load_ms == 0


def test_ar_decoder_has_no_drafter(tiny_same_bundle):
    assert SpeculativeDecoder(tiny_same_bundle, strategy="ar", threads=1).drafter is None


def test_is_cpu_only():
    assert is_cpu_only("cpu") and is_cpu_only(None) and is_cpu_only(["cpu"])
    assert not is_cpu_only("cuda") and not is_cpu_only(["cuda", "cpu"])
