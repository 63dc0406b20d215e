"""edgespec's GGUF tokenizer converter (models/gguf_tokenizer.py) against llama.cpp's tokenizer.

- Small GGUF files written here with the `gguf` writer pin llama.cpp's SentencePiece-BPE rule (the
  highest-scoring mergeable pair first: " the" is one token, not transformers' Unigram `▁t he`),
  byte fallback, raw-text user-defined tokens, add_space_prefix, and the one-line errors.
- `real` (CI): SmolLM2's GGUF must give exactly the ids llama.cpp's `llama-tokenize` gave on
  models.tokenizer_reference.REFERENCE_LINES (tests/data/smollm2_reference_ids.json, written by
  benchmarks/tokenizer_reference.py --write-expected), and llama.cpp's special tokens.
- `long` (by hand, needs $EDGESPEC_LLAMA_TOKENIZE and pulled GGUFs): every recipe model on the full
  corpus (benchmarks/tokenizer_corpus.jsonl), Qwen against transformers' own conversion, and an old
  Gemma bundle refused by Bundle.load.
"""
from __future__ import annotations

import json
import shutil
import unicodedata
from pathlib import Path

import pytest

gguf = pytest.importorskip("gguf")

from edgespec.errors import BundleError, GenerationError, ModelSourceError  # noqa: E402
from edgespec.models import get_model  # noqa: E402
from edgespec.models import gguf_tokenizer as gt  # noqa: E402
from edgespec.models import tokenizer_reference as ref  # noqa: E402
from edgespec.models.weights import assemble_gguf, local_gguf  # noqa: E402
from edgespec.runtime.bundle.bundle import TOKENIZER_FIXED_IN, Bundle, stale_gguf_tokenizer  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
EXPECTED = ROOT / "tests" / "data" / "smollm2_reference_ids.json"
CORPUS = ROOT / "benchmarks" / "tokenizer_corpus.jsonl"
BYTES = [f"<0x{b:02X}>" for b in range(256)]


def write_gguf(path: Path, model: str, tokens: list[str], types: list[int], scores=None, merges=None,
               pre: str | None = None, add_space_prefix: bool | None = None, template: str | None = None) -> Path:
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tokenizer_model(model)
    if pre is not None:
        w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    if scores is not None:
        w.add_token_scores(scores)
    if merges is not None:
        w.add_token_merges(merges)
    if add_space_prefix is not None:
        w.add_add_space_prefix(add_space_prefix)
    if template is not None:
        w.add_chat_template(template)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def spm_gguf(tmp_path: Path, add_space_prefix: bool = False) -> Path:
    pieces = [("<unk>", 2, 0.0), ("<s>", 3, 0.0), ("</s>", 3, 0.0), ("  ", 4, 0.0)]
    pieces += [(b, 6, 0.0) for b in BYTES]
    # scores as a SentencePiece BPE vocabulary has them: higher = merged earlier
    pieces += [("▁", 1, -1.0), ("t", 1, -2.0), ("h", 1, -3.0), ("e", 1, -4.0), ("▁t", 1, -5.0), ("he", 1, -6.0),
               ("th", 1, -9.0), ("▁the", 1, -7.0), ("a", 1, -8.0), ("b", 1, -8.5)]
    toks, types, scores = zip(*pieces)
    return write_gguf(tmp_path / "spm.gguf", "llama", list(toks), list(types), list(scores),
                      add_space_prefix=add_space_prefix)


def pieces(tok, text: str) -> list[str]:
    return tok.encode(text, add_special_tokens=False).tokens


def test_spm_merges_highest_score_first_with_byte_fallback(tmp_path):
    tok = gt.build_tokenizer(gt.read_vocab(spm_gguf(tmp_path)))
    assert pieces(tok, " the") == ["▁the"]              # ▁t (-5), he (-6), then ▁the (-7); never "th" (-9)
    assert pieces(tok, "the") == ["t", "he"]            # "th" scores below "he": he merges first
    assert pieces(tok, "é") == ["<0xC3>", "<0xA9>"]     # not in the vocabulary: UTF-8 bytes
    assert pieces(tok, "a  b") == ["a", "  ", "b"]      # user-defined token matched on the raw text
    assert pieces(tok, "a b") == ["a", "▁", "b"]
    assert pieces(tok, "<s>the") == ["<s>", "t", "he"]  # control token parsed; no space prefix (Gemma 3)
    for text in (" the", "é the", "a  b\tthe", "<s> x"):
        assert tok.decode(tok.encode(text, add_special_tokens=False).ids, skip_special_tokens=False) == text


def test_spm_space_prefix_after_each_special_token(tmp_path):
    v = gt.read_vocab(spm_gguf(tmp_path, add_space_prefix=True))
    sp = gt.special_tokens(v)
    assert (sp.bos_id, sp.eos_id, sp.unk_id, sp.add_bos, sp.add_eos) == (1, 2, 0, True, False)  # llama.cpp's SPM defaults
    tok = gt.build_tokenizer(v, sp)
    assert pieces(tok, "the") == ["▁the"]
    assert pieces(tok, "the<s>the") == ["▁the", "<s>", "▁the"]  # llama.cpp: a prefix after a special token
    assert tok.encode("the").tokens == ["<s>", "▁the"]
    assert tok.decode(tok.encode("the a", add_special_tokens=False).ids) == "the a"


def test_unknown_tokenizer_model_is_one_line_error_naming_it(tmp_path):
    path = write_gguf(tmp_path / "rwkv.gguf", "rwkv", ["a", "b"], [1, 1])
    with pytest.raises(ModelSourceError) as e:
        gt.build_tokenizer(gt.read_vocab(path))
    assert "'rwkv'" in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(ModelSourceError) as e:
        gt.write_tokenizer(path, tmp_path)
    assert "'rwkv'" in str(e.value) and not (tmp_path / "tokenizer.json").exists()


def test_unknown_pre_tokenizer_is_one_line_error_naming_it(tmp_path):
    path = write_gguf(tmp_path / "bpe.gguf", "gpt2", ["a", "b", "ab"], [1, 1, 1], merges=["a b"], pre="tekken-x")
    with pytest.raises(ModelSourceError) as e:
        gt.build_tokenizer(gt.read_vocab(path))
    assert "'tekken-x'" in str(e.value) and "\n" not in str(e.value)


def test_no_chat_template_writes_none_and_chat_refuses_naming_the_bundle(tmp_path, tiny_same_bundle, copy_bundle):
    out = tmp_path / "tok"
    out.mkdir()
    (out / "chat_template.jinja").write_text("stale")      # an older converter's file is removed
    prov = gt.write_tokenizer(spm_gguf(tmp_path), out)
    cfg = json.loads((out / "tokenizer_config.json").read_text())
    assert prov["chat_template"] is False and "chat_template" not in cfg and not (out / "chat_template.jinja").exists()
    assert gt.converted_here(out) and cfg["bos_token"] == "<s>" and cfg["add_bos_token"] is True

    copy = copy_bundle(tiny_same_bundle, "no-template")
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["files"] = {k: v for k, v in manifest["files"].items() if "chat_template" not in k}
    for f in copy.rglob("chat_template.jinja"):
        f.unlink()
    (copy / "manifest.json").write_text(json.dumps(manifest))
    b = Bundle.load(copy, verify="fast")
    with pytest.raises(GenerationError) as e:
        b.require_chat_template()
    assert str(copy) in str(e.value) and "\n" not in str(e.value)
    assert Bundle.load(tiny_same_bundle, verify="fast").require_chat_template()


def test_bundle_with_a_unigram_gemma_tokenizer_is_refused(tiny_same_bundle, copy_bundle):
    from tokenizers import Tokenizer, models

    # What transformers 4.57 made of Gemma's GGUF: a Unigram model over a SentencePiece-BPE vocabulary.
    vocab = [("<pad>", 0.0), ("<eos>", 0.0), ("<bos>", 0.0), ("<unk>", 0.0), ("<start_of_turn>", 0.0),
             ("<end_of_turn>", 0.0)] + [(b, 0.0) for b in BYTES] + [("▁t", -1.0), ("he", -2.0), ("▁the", -3.0)]
    unigram = Tokenizer(models.Unigram(vocab, unk_id=3, byte_fallback=True))
    assert "Unigram" in stale_gguf_tokenizer(unigram)
    copy = copy_bundle(tiny_same_bundle, "old-gemma")
    unigram.save(str(copy / "target" / "tokenizer.json"))
    with pytest.raises(BundleError) as e:
        Bundle.load(copy, verify="none")
    assert f"re-export with edgespec >= {TOKENIZER_FIXED_IN}" in str(e.value) and "\n" not in str(e.value)
    assert stale_gguf_tokenizer(Tokenizer.from_file(str(tiny_same_bundle / "target" / "tokenizer.json"))) is None


# ----------------------------------------------------------------------------- real: SmolLM2 (CI)

@pytest.fixture(scope="module")
def smollm_gguf() -> Path:
    return assemble_gguf(get_model("smollm2-135m"), progress=False)


@pytest.fixture(scope="module")
def smollm_vocab(smollm_gguf) -> gt.GGUFVocab:
    return gt.read_vocab(smollm_gguf)


@pytest.mark.real
def test_smollm2_ids_are_llama_cpps(smollm_vocab):
    exp = json.loads(EXPECTED.read_text(encoding="utf-8"))
    assert exp["sha256"] == get_model("smollm2-135m").sha256 and exp["lines"] == list(ref.REFERENCE_LINES)
    tok = gt.build_tokenizer(smollm_vocab)
    got = [tok.encode(t, add_special_tokens=False).ids for t in exp["lines"]]
    assert [i for i, (a, b) in enumerate(zip(got, exp["ids"])) if a != b] == []
    assert [t for t, ids in zip(exp["lines"], got) if tok.decode(ids, skip_special_tokens=False) != t] == []


@pytest.mark.real
def test_smollm2_special_tokens_are_llama_cpps(smollm_gguf, smollm_vocab, tmp_path):
    from edgespec.runtime.bundle.vocab import tokenizer_info

    sp = gt.special_tokens(smollm_vocab)
    # llama.cpp: bos/eos/pad from the GGUF; EOG = eos + <|endoftext|> by text + <reponame> as FIM repo
    assert (sp.bos_id, sp.eos_id, sp.pad_id, sp.add_bos, sp.add_eos, sp.eog_ids) == (1, 2, 2, False, False, [0, 2, 4])
    gt.write_tokenizer(smollm_gguf, tmp_path)
    info = tokenizer_info(tmp_path)
    assert info.bos_id == 1 and info.add_bos is False and info.chat_template.startswith("{% for message in messages")


# ----------------------------------------------------------------------------- long: every recipe, llama.cpp

def _binary():
    b = ref.find_llama_tokenize()
    if b is None:
        pytest.skip(f"needs llama.cpp's llama-tokenize (${ref.ENV})")
    return b


@pytest.mark.long
@pytest.mark.parametrize("name", ["smollm2-135m", "gemma3-270m", "qwen2.5-coder-0.5b"])
def test_recipe_tokenizer_matches_llama_cpp_on_the_corpus(name):
    binary = _binary()
    path = local_gguf(get_model(name)) or pytest.skip(f"edgespec models pull {name} first")
    v = gt.read_vocab(path)
    tok = gt.build_tokenizer(v)
    lines = ref.load_corpus(CORPUS)
    res = ref.compare(tok, path, lines, binary)
    assert res.lines >= 300 and res.identical == res.lines, res.summary()
    # SentencePiece writes spaces as "▁": only a line with a literal U+2581 may decode differently
    ambiguous = {i for i, t in enumerate(lines) if v.model == "llama" and "\u2581" in t}
    assert set(res.roundtrip_failures) <= ambiguous, res.summary()
    assert tok.encode("Hello").ids == ref.llama_ids_with_bos(binary, path, "Hello")


@pytest.mark.long
def test_qwen_tokenizer_agrees_with_transformers_conversion():
    from transformers import AutoTokenizer

    path = local_gguf(get_model("qwen2.5-coder-0.5b")) or pytest.skip("edgespec models pull qwen2.5-coder-0.5b first")
    ours = gt.build_tokenizer(gt.read_vocab(path))
    theirs = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    lines = ref.load_corpus(CORPUS)
    differ = {i for i, t in enumerate(lines)
              if ours.encode(t, add_special_tokens=False).ids != theirs.encode(t, add_special_tokens=False)}
    # transformers adds Qwen2's NFC normalizer (llama.cpp does not normalise), and reads "</s>" as text
    # (llama.cpp parses it as one control token): exactly those lines may differ, and the corpus has both
    explained = {i for i, t in enumerate(lines) if unicodedata.normalize("NFC", t) != t or "</s>" in t}
    assert differ == explained and len(explained) >= 2


@pytest.mark.long
def test_gemma_bundle_with_transformers_tokenizer_is_refused(tiny_same_bundle, copy_bundle, tmp_path):
    from transformers import AutoTokenizer

    path = local_gguf(get_model("gemma3-270m")) or pytest.skip("edgespec models pull gemma3-270m first")
    old = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    old.save_pretrained(str(tmp_path / "old"))
    copy = copy_bundle(tiny_same_bundle, "gemma-old")
    shutil.copyfile(tmp_path / "old" / "tokenizer.json", copy / "target" / "tokenizer.json")
    with pytest.raises(BundleError) as e:
        Bundle.load(copy, verify="none")
    assert f"re-export with edgespec >= {TOKENIZER_FIXED_IN}" in str(e.value)
    gt.write_tokenizer(path, tmp_path)
    from tokenizers import Tokenizer

    assert stale_gguf_tokenizer(Tokenizer.from_file(str(tmp_path / "tokenizer.json"))) is None


@pytest.mark.real
def test_pull_rewrites_a_tokenizer_an_older_converter_wrote(smollm_gguf, tmp_path, monkeypatch):
    from edgespec.models.weights import refresh_tokenizer

    monkeypatch.delenv(ref.ENV, raising=False)
    monkeypatch.setenv("PATH", "")                       # no llama-tokenize: the check is skipped, and recorded so
    d = tmp_path / "smollm2-135m"
    d.mkdir()
    (d / "tokenizer.model").write_text("an older converter's file")
    (d / "generation_config.json").write_text('{"eos_token_id": 2, "max_length": 20}')
    assert not gt.converted_here(d)
    refresh_tokenizer(d, smollm_gguf)
    assert gt.converted_here(d) and not (d / "tokenizer.model").exists() and (d / "chat_template.jinja").is_file()
    gen = json.loads((d / "generation_config.json").read_text())
    assert gen["eos_token_id"] == [0, 2, 4] and gen["max_length"] == 20       # llama.cpp's EOG set; the rest kept
    prov = json.loads((d / gt.PROVENANCE_FILE).read_text())
    assert "skipped" in prov["reference"] and prov["eog_ids"] == prov["stop_ids"] == [0, 2, 4]
    assert not list(tmp_path.glob("*.tok-*"))            # no temporary directory left


@pytest.mark.long
def test_gemma_and_qwen_stop_on_their_control_tokens_not_on_text_llama_cpp_promotes():
    for name, stop, promoted in (("gemma3-270m", ["<eos>", "<end_of_turn>"], "</s>"),
                                 ("qwen2.5-coder-0.5b", ["<|endoftext|>", "<|im_end|>", "<|fim_pad|>", "<|repo_name|>",
                                                         "<|file_sep|>"], "</s>")):
        path = local_gguf(get_model(name)) or pytest.skip(f"edgespec models pull {name} first")
        v = gt.read_vocab(path)
        sp = gt.special_tokens(v)
        assert [v.tokens[i] for i in sp.stop_ids] == stop
        assert promoted not in stop and v.tokens.index(promoted) in sp.eog_ids      # llama.cpp's EOG has it
