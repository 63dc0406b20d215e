"""Streaming token counts over files/globs/jsonl, skipped files, special-token affixes, cross-vocab mapping."""
from __future__ import annotations

import gzip
import json

import numpy as np
import pytest

import tinymodels
from edgespec.calibrate import counts as ct
from edgespec.errors import CalibrationError


@pytest.fixture(scope="module")
def toks():
    return tinymodels.tiny_tokenizers()


def _direct(tok, texts, size, add_special=True):
    out = np.zeros(size, dtype=np.int64)
    for t in texts:
        np.add.at(out, tok.encode(t, add_special_tokens=add_special).ids, 1)
    return out


@pytest.mark.parametrize("kind", ["bytelevel", "spiece"])
def test_streamed_counts_equal_whole_text_counts(tmp_path, toks, monkeypatch, kind):
    """Small chunks (clean cuts only; no prefix space on continuation chunks) keep the tokenisation."""
    tok = toks[kind]
    text = (tinymodels.CODE + "\n\n" + tinymodels.ENGLISH + "  \n") * 40
    (tmp_path / "a.py").write_text(text, encoding="utf-8")
    monkeypatch.setattr(ct, "CHUNK_CHARS", 200)
    monkeypatch.setattr(ct, "BATCH_CHARS", 1000)
    size = tok.get_vocab_size()
    c = ct.TokenCounter(tok, size)
    stats = ct.count_corpus([tmp_path / "a.py"], [c], progress=False)
    np.testing.assert_array_equal(c.counts, _direct(tok, [text], size))
    assert stats.files == 1 and stats.documents == 1 and stats.chars == len(text)
    assert stats.tokens == int(c.counts.sum())


def test_chunks_are_bounded_and_cut_cleanly():
    lines = [("    x = 1\n" if i % 3 else "def f():\n") for i in range(1000)]
    chunks = list(ct.chunk_lines(lines, chunk_chars=100))
    assert "".join(chunks) == "".join(lines)
    assert max(len(c) for c in chunks) <= 100 + 3 * 10
    assert all(c.startswith("def") and not c[-2].isspace() for c in chunks[1:])
    # no clean cut at all (every line indented): forced cuts keep chunks bounded
    lines = ["    y = 2\n"] * 1000
    chunks = list(ct.chunk_lines(lines, chunk_chars=100))
    assert "".join(chunks) == "".join(lines) and max(len(c) for c in chunks) <= 800 + 10


def test_bos_counted_once_per_document(tmp_path, toks):
    """The SentencePiece-style tokenizer adds <s>: once per document (per jsonl record), not per chunk."""
    tok = toks["spiece"]
    recs = [{"text": "hello world"}, {"text": "def f():\n    return 1\n"}, {"other": 1, "text": "x"}]
    path = tmp_path / "d.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in recs) + "\n")
    size = tok.get_vocab_size()
    c = ct.TokenCounter(tok, size)
    stats = ct.count_corpus([path], [c], progress=False)
    bos = tok.token_to_id("<s>")
    assert c.counts[bos] == 3 and stats.documents == 3
    np.testing.assert_array_equal(c.counts, _direct(tok, [r["text"] for r in recs], size))


def test_glob_directory_gz_and_jsonl_field(tmp_path, toks):
    tok = toks["bytelevel"]
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "a.txt").write_text("alpha beta\n")
    with gzip.open(tmp_path / "sub" / "b.txt.gz", "wt", encoding="utf-8") as f:
        f.write("gamma delta\n")
    with gzip.open(tmp_path / "c.jsonl.gz", "wt", encoding="utf-8") as f:
        f.write(json.dumps({"body": "epsilon"}) + "\n")
    paths = ct.expand_inputs([str(tmp_path / "**" / "*.txt*"), str(tmp_path / "sub"), str(tmp_path / "c.jsonl.gz")])
    assert [p.name for p in paths] == ["a.txt", "b.txt.gz", "c.jsonl.gz"]     # de-duplicated
    c = ct.TokenCounter(tok, tok.get_vocab_size())
    ct.count_corpus(paths, [c], jsonl_field="body", progress=False)
    np.testing.assert_array_equal(c.counts, _direct(tok, ["alpha beta\n", "gamma delta\n", "epsilon"],
                                                     tok.get_vocab_size()))


def test_jsonl_token_ids_are_counted_directly(tmp_path, toks):
    tok = toks["bytelevel"]
    path = tmp_path / "g.jsonl"
    path.write_text(json.dumps({"token_ids": [5, 5, 7]}) + "\n")
    c = ct.TokenCounter(tok, tok.get_vocab_size())
    ct.count_corpus([path], [c], jsonl_field="token_ids", progress=False)
    assert c.counts[5] == 2 and c.counts[7] == 1 and c.counts.sum() == 3


def test_binary_and_non_utf8_files_are_skipped_with_a_count(tmp_path, toks, capsys):
    tok = toks["bytelevel"]
    (tmp_path / "ok.txt").write_text("plain text\n")
    (tmp_path / "bin.dat").write_bytes(b"\x7fELF\x00\x01\x02" * 50)
    (tmp_path / "latin1.txt").write_bytes("caf\xe9 ".encode("latin-1") * 10 + b"\n")
    # a file that fails half-way: its first part must not be counted
    (tmp_path / "late.txt").write_bytes(("good line\n" * 20000).encode() + b"\xff\xfe bad\n")
    with gzip.open(tmp_path / "trunc.txt.gz", "wb") as f:
        f.write(b"some text\n" * 100)
    (tmp_path / "trunc.txt.gz").write_bytes((tmp_path / "trunc.txt.gz").read_bytes()[:-12])
    c = ct.TokenCounter(tok, tok.get_vocab_size())
    stats = ct.count_corpus(sorted(tmp_path.iterdir()), [c], progress=False)
    assert stats.files == 1
    assert len(stats.skipped_binary) == 2 and len(stats.skipped_not_utf8) == 2
    np.testing.assert_array_equal(c.counts, _direct(tok, ["plain text\n"], tok.get_vocab_size()))
    err = capsys.readouterr().err
    assert "skipped 4 file(s)" in err and "bin.dat: binary" in err


def test_empty_corpus_and_globs_matching_nothing(tmp_path, toks):
    tok = toks["bytelevel"]
    (tmp_path / "empty.txt").write_text("")
    c = ct.TokenCounter(tok, tok.get_vocab_size())
    with pytest.raises(CalibrationError, match="empty corpus"):
        ct.count_corpus([tmp_path / "empty.txt"], [c], progress=False)
    (tmp_path / "bin").write_bytes(b"\x00" * 10)
    with pytest.raises(CalibrationError, match=r"empty corpus.*1 skipped"):
        ct.count_corpus([tmp_path / "bin"], [c], progress=False)
    with pytest.raises(CalibrationError, match="matches no files"):
        ct.expand_inputs([str(tmp_path / "*.nothing")])
    with pytest.raises(CalibrationError, match="no such file"):
        ct.expand_inputs([str(tmp_path / "missing.txt")])
    (tmp_path / "emptydir").mkdir()
    with pytest.raises(CalibrationError, match="holds no files"):
        ct.expand_inputs([str(tmp_path / "emptydir")])
    with pytest.raises(CalibrationError, match="no --data"):
        ct.expand_inputs([])


def test_bad_jsonl_is_a_clear_error(tmp_path, toks):
    tok = toks["bytelevel"]
    path = tmp_path / "x.jsonl"
    path.write_text('{"text": "a"}\nnot json\n')
    c = ct.TokenCounter(tok, tok.get_vocab_size())
    with pytest.raises(CalibrationError, match=r"x.jsonl:2: not valid JSON"):
        ct.count_corpus([path], [c], progress=False)
    path.write_text('{"body": "a"}\n')
    with pytest.raises(CalibrationError, match="field 'text' is missing"):
        ct.count_corpus([path], [c], progress=False)


def test_max_tokens_budget_stops_between_files(tmp_path, toks):
    tok = toks["bytelevel"]
    for i in range(5):
        (tmp_path / f"{i}.txt").write_text("the quick brown fox\n" * 20)
    c = ct.TokenCounter(tok, tok.get_vocab_size())
    stats = ct.count_corpus(sorted(tmp_path.iterdir()), [c], max_tokens=1, progress=False)
    assert stats.files == 1 and stats.truncated


def test_map_counts_between_vocabularies(toks):
    """Target counts onto the drafter: through the string map, else re-tokenised with the count split."""
    from edgespec.runtime.bundle.vocab import build_maps

    bl, sp = toks["bytelevel"], toks["spiece"]
    d2t, t2d = build_maps(bl, sp)
    rng = np.random.default_rng(0)
    src = np.zeros(t2d.size)
    src[rng.choice(t2d.size, 300, replace=False)] = rng.integers(1, 50, 300)
    mapped = ct.map_counts(src, t2d, bl, sp, d2t.size)
    assert mapped.direct + mapped.retokenised + mapped.unmapped == pytest.approx(src.sum())
    assert mapped.counts.sum() == pytest.approx(mapped.direct + mapped.retokenised)
    assert mapped.retokenised > 0
    # a token with a counterpart moves whole; one without is split over its re-tokenised pieces
    has = np.flatnonzero((t2d >= 0) & (src > 0))[0]
    one = np.zeros_like(src)
    one[has] = 4
    assert ct.map_counts(one, t2d, bl, sp, d2t.size).counts[t2d[has]] == 4
    from edgespec.runtime.bundle.vocab import token_table

    table = token_table(bl)
    lone = next(i for i in range(t2d.size) if t2d[i] < 0 and table.keys[i] and not table.keys[i].startswith(b"special:")
                and len(sp.encode(table.keys[i].decode("utf-8", "ignore"), add_special_tokens=False).ids) > 1)
    one = np.zeros_like(src)
    one[lone] = 6
    m = ct.map_counts(one, t2d, bl, sp, d2t.size)
    pieces = sp.encode(table.keys[lone].decode("utf-8"), add_special_tokens=False).ids
    assert m.counts.sum() == pytest.approx(6) and m.retokenised == 6
    for pid in set(pieces):
        assert m.counts[pid] == pytest.approx(6 / len(pieces) * pieces.count(pid))


def test_streaming_really_chunks(tmp_path, toks, monkeypatch):
    seen = []
    real = ct.TokenCounter.add_texts
    monkeypatch.setattr(ct.TokenCounter, "add_texts",
                        lambda self, texts, start=True: seen.append(len(texts)) or real(self, texts, start))
    monkeypatch.setattr(ct, "CHUNK_CHARS", 200)
    monkeypatch.setattr(ct, "BATCH_CHARS", 1000)
    (tmp_path / "a.py").write_text(tinymodels.CODE * 20)
    c = ct.TokenCounter(toks["bytelevel"], toks["bytelevel"].get_vocab_size())
    ct.count_corpus([tmp_path / "a.py"], [c], progress=False)
    assert len(seen) > 5 and max(seen) <= 6
