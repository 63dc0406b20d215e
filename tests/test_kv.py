"""KV cache: prefill in one forward, crop by slicing, crop-and-continue == a fresh run."""
import numpy as np
import pytest

from edgespec.runtime import Bundle, SpeculativeDecoder
from edgespec.runtime.engine.kv import ModelRunner
from edgespec.runtime.engine.sessions import create_session

TEXT = "def quicksort(items):\n    pivot = items[len(items) // 2]\n    return quicksort(left) + middle"


def _runner(path, side="target"):
    b = Bundle.load(path)
    sess, _ = create_session(getattr(b, side).onnx, "cpu", threads=1)
    return b, ModelRunner(sess, side)


@pytest.mark.parametrize("side", ["target", "drafter"])
def test_crop_and_continue_equals_fresh_run(tiny_same_bundle, side):
    b, r = _runner(tiny_same_bundle, side)
    ids = b.target.tokenizer.encode(TEXT).ids
    assert len(ids) >= 20
    r.forward(ids[:10])
    r.forward(ids[10:16])                  # e.g. 6 drafted tokens...
    r.crop(12)                             # ...of which 2 were accepted
    assert r.length == 12 and all(p.shape[2] == 12 for p in r.cached_kv())
    got = r.forward(ids[12:18]).copy()
    r.reset()
    fresh_full = r.forward(ids[:18]).copy()
    r.reset()
    r.forward(ids[:12])
    fresh_split = r.forward(ids[12:18]).copy()
    np.testing.assert_allclose(got, fresh_split, rtol=0, atol=1e-5)
    np.testing.assert_allclose(got, fresh_full[12:18], rtol=0, atol=1e-5)


def test_crop_to_zero_and_bounds(tiny_self_bundle):
    b, r = _runner(tiny_self_bundle)
    ids = b.target.tokenizer.encode(TEXT).ids[:8]
    first = r.forward(ids).copy()
    r.crop(0)
    np.testing.assert_allclose(r.forward(ids), first, atol=1e-6)
    with pytest.raises(ValueError):
        r.crop(9)
    with pytest.raises(ValueError):
        r.crop(-1)


def test_decoder_never_reruns_the_prefix(tiny_same_bundle):
    """Target tokens fed = prompt (one prefill forward) + exactly the verify blocks, nothing re-fed."""
    dec = SpeculativeDecoder(tiny_same_bundle, strategy="tli", draft_length=3, threads=1)
    fed0, fw0 = dec.target.tokens_fed, dec.target.forwards
    res = dec.generate(TEXT, max_new_tokens=30)
    st = res.stats
    blocks = sum(d + 1 for d in st.drafted_per_step)
    assert dec.target.tokens_fed - fed0 == st.prompt_tokens + blocks
    assert dec.target.forwards - fw0 == st.target_forwards == 1 + st.verify_forwards
    assert sorted(st.verify_ms_by_k) == sorted({d + 1 for d in st.drafted_per_step})


@pytest.mark.parametrize("side", ["target", "drafter"])
def test_shared_buffer_equals_copying_cache(tiny_same_bundle, side, monkeypatch):
    """The builder graph's KV buffer, bound once and shared by past and present (crop = a length change,
    growth by doubling), gives bitwise the logits of the copying path through plain session.run."""
    import edgespec.runtime.engine.kv_shared as kv

    monkeypatch.setattr(kv, "CAPACITY_STEP", 8)        # grow several times within the sequence
    b, shared = _runner(tiny_same_bundle, side)
    assert shared.shared, "builder graphs declare a shared KV cache"
    copying = ModelRunner(shared.session, side, kv="copy")
    ids = b.target.tokenizer.encode(TEXT * 2).ids
    steps = [(ids[:10], None), (ids[10:15], 12), (ids[12:13], None), (ids[13:17], 14), (ids[14:30], None),
             (ids[30:31], 25), (ids[25:40], None)]
    for chunk, crop in steps:
        a, c = shared.forward(chunk).copy(), copying.forward(chunk).copy()
        assert np.array_equal(a, c)
        if crop is not None:
            shared.crop(crop)
            copying.crop(crop)
    assert shared.length == copying.length == 40 and shared.capacity >= 40
    shared.reset()
    copying.reset()
    assert shared.length == 0
    assert np.array_equal(shared.forward(ids[:6]), copying.forward(ids[:6]))   # buffers re-used after reset
