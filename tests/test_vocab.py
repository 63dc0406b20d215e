"""runtime/bundle/vocab.py: token normalisation, vocab hash, maps between tokenizers, special tokens."""
from __future__ import annotations

import json

import numpy as np
import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from edgespec.runtime.bundle import vocab as V


def _bytes_of(tok: Tokenizer, i: int) -> bytes:
    """Ground truth: what the tokenizer's own decoder makes of one id (UTF-8), for valid-UTF-8 tokens."""
    return tok.decode([i], skip_special_tokens=False).encode("utf-8")


def test_gpt2_byte_table():
    table = V.gpt2_byte_decoder()
    assert len(table) == 256 and sorted(table.values()) == list(range(256))
    assert table["Ġ"] == 0x20 and table["Ċ"] == 0x0A and table["A"] == 0x41
    # mojibake: "é" is UTF-8 C3 A9, which byte-level BPE writes as "Ã©"
    assert V.token_bytes("Ã©", "byte_level") == "é".encode()
    assert V.token_bytes("Ġthe", "byte_level") == b" the"


def test_sentencepiece_normalisation():
    assert V.token_bytes("\u2581the", "sentencepiece") == b" the"
    assert V.token_bytes("<0x0A>", "sentencepiece") == b"\n"
    assert V.token_bytes("<0xE2>", "sentencepiece") == b"\xe2"
    assert V.token_bytes("héllo", "sentencepiece") == "héllo".encode()
    assert V.token_bytes("<0xZZ>", "sentencepiece") == b"<0xZZ>"


def test_styles(tiny_tokenizers):
    assert V.tokenizer_style(tiny_tokenizers["bytelevel"]) == "byte_level"
    assert V.tokenizer_style(tiny_tokenizers["spiece"]) == "sentencepiece"


def test_vocab_hash_stable_and_distinct(tiny_tokenizers, tiny_models, tmp_path):
    bl, sp = tiny_tokenizers["bytelevel"], tiny_tokenizers["spiece"]
    h = V.vocab_hash(bl)
    assert len(h) == 64 and h == V.vocab_hash(bl)
    assert h != V.vocab_hash(sp)
    # same from a file, a directory and a transformers fast tokenizer
    bl.save(str(tmp_path / "tok.json"))
    assert V.vocab_hash(tmp_path / "tok.json") == h
    assert V.vocab_hash(tiny_models["tiny-bl-a"]) == h
    from transformers import AutoTokenizer

    assert V.vocab_hash(AutoTokenizer.from_pretrained(str(tiny_models["tiny-bl-a"]))) == h
    # definition: sha256 of the sorted (token, id) list, compact JSON
    import hashlib

    items = sorted(bl.get_vocab(with_added_tokens=True).items())
    blob = json.dumps(items, ensure_ascii=False, separators=(",", ":")).encode()
    assert h == hashlib.sha256(blob).hexdigest()


def test_same_tokenizer_maps_are_identity(tiny_tokenizers):
    bl = tiny_tokenizers["bytelevel"]
    n = bl.get_vocab_size(with_added_tokens=True)
    d2t, t2d = V.build_maps(bl, bl, target_size=n + 8, drafter_size=n + 8)
    assert d2t.dtype == np.int64 and d2t.shape == (n + 8,) and t2d.shape == (n + 8,)
    assert np.array_equal(d2t[:n], np.arange(n)) and np.array_equal(t2d[:n], np.arange(n))
    assert np.all(d2t[n:] == -1) and np.all(t2d[n:] == -1)  # padded model vocabulary has no tokens


def test_hetero_maps_match_decoded_bytes(tiny_tokenizers):
    bl, sp = tiny_tokenizers["bytelevel"], tiny_tokenizers["spiece"]
    d2t, t2d = V.build_maps(bl, sp)
    tt, dt = V.token_table(bl), V.token_table(sp)
    mapped = np.nonzero(d2t >= 0)[0]
    assert len(mapped) > 200
    for i in mapped:
        assert dt.keys[i] == tt.keys[d2t[i]]
    for j in np.nonzero(t2d >= 0)[0]:
        assert tt.keys[j] == dt.keys[t2d[j]]
    # ▁ and Ġ both mean a space
    sv, bv = sp.get_vocab(), bl.get_vocab()
    common = [w for w in ("the", "def", "return", "self") if "\u2581" + w in sv and "Ġ" + w in bv]
    assert common
    for w in common:
        assert d2t[sv["\u2581" + w]] == bv["Ġ" + w]
    # byte-fallback tokens match the byte-level single-byte tokens, including non-ASCII bytes
    table = {b: c for c, b in V.gpt2_byte_decoder().items()}
    for b in (0x0A, 0x41, 0xC3, 0xE2):
        assert d2t[sv[f"<0x{b:02X}>"]] == bv[table[b]]
    # specials only match the same special content
    assert d2t[sv["<s>"]] == -1 and d2t[sv["</s>"]] == -1


def test_map_ground_truth_against_decoders(tiny_tokenizers):
    """For tokens that decode to valid UTF-8 on their own, mapped pairs decode to the same text."""
    bl, sp = tiny_tokenizers["bytelevel"], tiny_tokenizers["spiece"]
    d2t, _ = V.build_maps(bl, sp)
    dt = V.token_table(sp)
    checked = 0
    for i in np.nonzero(d2t >= 0)[0]:
        if i in dt.added or i in dt.byte_fallback:
            continue
        tok = sp.id_to_token(int(i))
        if tok.startswith("\u2581"):
            continue  # the SP decoder strips a leading space of the first token
        assert _bytes_of(sp, int(i)) == _bytes_of(bl, int(d2t[i]))
        checked += 1
    assert checked > 50


def _wordlevel(tokens: list[str], specials: list[str], byte_level: bool) -> Tokenizer:
    tok = Tokenizer(models.WordLevel({t: i for i, t in enumerate(tokens)}, unk_token=tokens[0]))
    if byte_level:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
    else:
        tok.pre_tokenizer = pre_tokenizers.Metaspace()
        tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()])
    tok.add_special_tokens(specials)
    return tok


def test_specials_match_by_content_and_canonical_ids():
    # target: byte-level with ChatML markers; drafter: SentencePiece with a duplicated byte (normal "A" and <0x41>)
    t = _wordlevel(["<unk>", "A", "ĠA", "Ã©", "<|im_end|>"], ["<|im_end|>"], byte_level=True)
    d = _wordlevel(["<unk>", "<0x41>", "A", "\u2581A", "é", "<|im_end|>", "<0xC3>"], ["<|im_end|>"], byte_level=False)
    d2t, t2d = V.build_maps(t, d)
    assert d2t.tolist() == [0, 1, 1, 2, 3, 4, -1]  # plain "<unk>" text matches plain "<unk>"
    # the target's "A" maps back to the drafter's normal "A" (id 2), not the byte-fallback <0x41>
    assert t2d.tolist() == [0, 2, 3, 4, 5]
    assert V.intersection_size(d2t) == 6


def test_tokenizer_info_tiny(tiny_models):
    bl = V.tokenizer_info(tiny_models["tiny-bl-a"])
    assert bl.bos_id == 1 and bl.eos_ids[0] == 2 and bl.pad_id == 0 and not bl.add_bos
    assert "<|im_start|>" in bl.chat_template and set(bl.special_ids) >= {0, 1, 2}
    sp = V.tokenizer_info(tiny_models["tiny-sp"])
    assert sp.add_bos and sp.bos_id == 1 and 2 in sp.eos_ids and sp.style == "sentencepiece"
    assert set(sp.special_ids) >= {0, 1, 2, 3, 4, 5}


@pytest.mark.real
def test_real_intersections_if_cached():
    """Intersection sizes with Qwen (docs/facts.md: SmolLM2 39,234 text tokens; Gemma 95,786 after byte decoding)."""
    from edgespec.models.weights import cached_dir

    q, s, g = cached_dir("qwen2.5-coder-1.5b"), cached_dir("smollm2-135m"), cached_dir("gemma3-270m")
    if q is None or s is None:
        pytest.skip("Qwen 1.5B / SmolLM2 not pulled")
    d2t, _ = V.build_maps(q, s)
    # 39,234 text tokens + 3 shared special tokens (<|endoftext|>, <|im_start|>, <|im_end|>)
    assert V.intersection_size(d2t) == 39234 + 3
    if g is not None:
        tt, gt = V.token_table(q), V.token_table(g)
        inter = {k for k in tt.keys if k is not None} & {k for k in gt.keys if k is not None}
        assert 95_786 <= len(inter) <= 96_000
