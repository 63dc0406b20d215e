"""Teacher-forced passes: text alignment between tokenizers and windowed logits (edgespec.calibrate.forced_logits)."""
from __future__ import annotations

import numpy as np
import pytest

import tinymodels
from edgespec.calibrate import forced_logits as tf

TEXT = tinymodels.ENGLISH + tinymodels.CODE


def _prefix_bytes(off, ids, upto):
    return b"".join(off.pieces[i] for i in ids[:upto])


def test_aligned_positions_predict_tokens_starting_at_the_same_byte(tiny_tokenizers):
    t = tf.ByteOffsets(tiny_tokenizers["bytelevel"])
    d = tf.ByteOffsets(tiny_tokenizers["spiece"])        # adds <s>, prepends ▁
    start = len(TEXT[:200].encode())
    seq = tf.aligned_sequence(TEXT, start, t, d)
    assert seq is not None and seq.pairs.shape[0] > 50
    for tr, dr in seq.pairs:
        # the text before the predicted token is the same for both models
        t_prefix = _prefix_bytes(t, seq.target_ids, tr + 1)
        d_prefix = _prefix_bytes(d, seq.drafter_ids, dr + 1)[len(b"<s>"):]      # BOS is not text
        d_prefix = d_prefix[1:] if d_prefix.startswith(b" ") else d_prefix     # the prepended ▁
        assert t_prefix == d_prefix and len(t_prefix) >= start
    # every common boundary was found: count them independently
    tb = set(np.cumsum(t.lengths[seq.target_ids]).tolist())
    d_lens = d.lengths[seq.drafter_ids].copy()
    d_lens[0] = 0
    db = set((np.cumsum(d_lens) - 1).tolist())
    common = {b for b in tb & db if start <= b < len(TEXT.encode())}
    assert seq.pairs.shape[0] == len(common)


def test_same_tokenizer_positions_cover_the_generated_part():
    ids = np.arange(10, 30)
    seq = tf.same_tokenizer_sequence(ids, start=5, max_len=15)
    assert seq.pairs[:, 0].tolist() == list(range(4, 14)) and (seq.pairs[:, 0] == seq.pairs[:, 1]).all()
    assert tf.same_tokenizer_sequence(ids, start=20) is None


def test_generated_text_with_a_split_character_is_cut_before_it(tiny_tokenizers):
    bl = tiny_tokenizers["bytelevel"]
    t = tf.ByteOffsets(bl)
    d = tf.ByteOffsets(tiny_tokenizers["spiece"])
    prompt = "Say: "
    ids = bl.encode(prompt + "hello 🚀 world", add_special_tokens=False).ids
    # drop the last byte-token of the emoji: the decoded bytes are no longer valid UTF-8 from there
    emoji_end = next(i for i in range(len(ids)) if _prefix_bytes(t, ids, i + 1).endswith("🚀".encode()))
    broken = np.array(ids[:emoji_end] + ids[emoji_end + 1:])
    text, kept, starts = t.text_of(broken, prompt.encode())
    assert text == prompt + "hello " and kept.size <= emoji_end
    seq = tf.aligned_generation(broken, prompt, t, d, own_is_target=True)
    assert seq is not None and np.array_equal(seq.target_ids, kept)
    assert t.text_of(broken, b"other prompt") is None


def test_windowed_onnx_logits_equal_one_pass_and_torch(tiny_same_bundle, tiny_models):
    from edgespec.runtime import Bundle

    b = Bundle.load(tiny_same_bundle)
    ids = np.array(b.target.tokenizer.encode(TEXT[:600]).ids[:90], dtype=np.int64)
    rows = np.array([0, 3, 17, 40, 41, 88])
    full = tf.OrtLogits(b.target.onnx, window=1000)(ids, rows)
    windowed = tf.OrtLogits(b.target.onnx, window=7)(ids, rows)
    np.testing.assert_allclose(windowed, full, atol=1e-4)
    torch_logits = tf.TorchLogits(tiny_models["tiny-bl-a"], window=16)(ids, rows)
    np.testing.assert_allclose(torch_logits, full, atol=1e-3)
    cols = np.array([5, 9, 100])
    np.testing.assert_allclose(tf.OrtLogits(b.target.onnx, cols=cols)(ids, rows), full[:, cols], atol=1e-4)


def test_tli_rows_zero_columns_without_target_and_renormalise():
    logits = np.array([[1.0, 2.0, 3.0], [0.0, 0.0, 5.0]], dtype=np.float32)
    q = tf.tli_rows(logits, np.array([4, -1, 7]), temperature=1.0)
    assert q[:, 1].tolist() == [0.0, 0.0]
    np.testing.assert_allclose(q.sum(axis=1), 1.0, rtol=1e-6)
    e = np.exp([1.0, 3.0])
    assert q[0, 0] == pytest.approx(e[0] / e.sum(), rel=1e-6)
