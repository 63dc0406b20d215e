"""A GGUF file's tokenizer as a `tokenizers.Tokenizer` that tokenizes as llama.cpp does. Torch-free.

transformers 4.57 converts Gemma-3's GGUF tokenizer wrongly: it builds a Unigram model from the
scores of a SentencePiece *BPE* vocabulary (transformers #41494, fixed after 4.57 by PR #48656), so
`" the"` became `▁t he`. This module is edgespec's own converter, built on `tokenizers` and the
`gguf` reader (the [export] extra; imported on use), following llama.cpp's src/llama-vocab.cpp:

- `llama` (SentencePiece BPE: Gemma 1-3, Llama 2, Mistral): llama.cpp splits the text into UTF-8
  characters and repeatedly merges the adjacent pair whose joined text is a vocab token with the
  highest score (ties: leftmost); characters left unmatched become `<0xXX>` byte tokens. That is a
  `tokenizers` BPE with byte fallback whose merges are every split of a token into two vocab pieces,
  ranked by the token's score. Spaces become `▁`; `add_space_prefix` prepends one to each text
  fragment that starts the text or follows a special token (a Prepend normalizer, which `tokenizers`
  runs per fragment between added tokens, does exactly that).
- `gpt2` (byte-level BPE: Qwen2, Llama 3, SmolLM2, GPT-2): the GGUF merges, and the pre-tokenizer
  regexes llama.cpp uses for `tokenizer.ggml.pre` (verbatim), then the byte-level mapping.
- Control, unknown and user-defined tokens are added tokens matched on the raw text, as llama.cpp's
  `tokenizer_st_partition` does with parse_special on (control/unknown: special=True), after
  llama.cpp's rules that make tokens control by their text (`llama_cpp_types`: EOT/FIM/EOG texts).

Special ids, add_bos/add_eos, the end-of-generation set and the chat template are read from the
GGUF with llama.cpp's defaults and rules (`special_tokens`). A tokenizer model or pre-tokenizer this
module does not know is a one-line ModelSourceError naming it.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

from edgespec.errors import ModelSourceError
from edgespec.models import gguf_reader

CONVERTER = "edgespec-gguf-tokenizer"
CONVERTER_VERSION = 2          # bump when the output changes; recorded in PROVENANCE_FILE
PROVENANCE_FILE = "edgespec-tokenizer.json"
SPACE = "\u2581"               # ▁

# llama.cpp token types (tokenizer.ggml.token_type)
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

# llama.cpp's pre-tokenizer regexes (llm_tokenizer_bpe), applied in order; case-insensitive
# contractions spelled out as llama.cpp does.
_CONTRACTIONS = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_LLAMA3 = _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
_QWEN2 = _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
PRE_TOKENIZERS: dict[str, tuple[tuple[str, ...], bool]] = {     # pre -> (regexes, ignore_merges)
    "default": ((_GPT2,), False), "gpt-2": ((_GPT2,), False), "gpt2": ((_GPT2,), False),
    "llama3": ((_LLAMA3,), True), "llama-v3": ((_LLAMA3,), True), "llama-bpe": ((_LLAMA3,), True),
    "smaug-bpe": ((_LLAMA3,), False), "dbrx": ((_LLAMA3,), False),
    "qwen2": ((_QWEN2,), False), "deepseek-r1-qwen": ((_QWEN2,), False), "stablelm2": ((_QWEN2,), False),
    "smollm": ((r"\p{N}", _GPT2), False), "starcoder": ((r"\p{N}", _GPT2), False),
    "refact": ((r"\p{N}", _GPT2), False),
}
# llama.cpp (0c1e570) finds these tokens by their text when the GGUF gives no id, and makes the token it
# finds a control token (so it is parsed as special, even when the GGUF typed it normal). For each kind,
# the first text found in this order (llama.cpp walks a hash map: with two candidates its pick may differ).
BY_TEXT = {
    "eot_token_id": ("<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>",
                     "<EOT>", "_<EOT>", "[EOT]", "<｜end▁of▁sentence｜>", "<end_of_utterance>"),
    "eom_token_id": ("<|eom_id|>",),
    "fim_pre_token_id": ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>", "▁<PRE>",
                         "<|code_prefix|>", "<|prefix|>"),
    "fim_suf_token_id": ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>", "▁<SUF>",
                         "<|code_suffix|>", "<|suffix|>"),
    "fim_mid_token_id": ("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>", "▁<MID>",
                         "<|code_middle|>", "<|middle|>"),
    "fim_pad_token_id": ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"),
    "fim_rep_token_id": ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
    "fim_sep_token_id": ("<|file_sep|>",),
}
# Every token with one of these texts ends generation and becomes a control token. Note "</s>": in
# Qwen2's vocabulary it is a normal token that byte-level BPE never produces; llama.cpp (with a
# "probably a bug in the model" warning) parses the text "</s>" as that one token and stops on it.
EOG_TEXTS = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
             "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
             "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
             "<｜end▁of▁sentence｜>", "[e~[")
ALWAYS_RENDERED = ("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>")   # gpt-oss: user-defined


@dataclass
class GGUFVocab:
    """The tokenizer part of a GGUF's metadata."""
    model: str
    pre: str | None
    tokens: list[str]
    types: list[int]
    scores: list[float] | None
    merges: list[str] | None
    kv: dict = field(default_factory=dict)   # the other tokenizer.* scalar keys (ids, flags, template)

    def get(self, key: str, default=None):
        return self.kv.get(f"tokenizer.ggml.{key}", default)


@dataclass
class SpecialTokens:
    """What llama.cpp reads from a GGUF about special tokens (ids are None when absent)."""
    bos_id: int | None
    eos_id: int | None
    eot_id: int | None
    unk_id: int | None
    pad_id: int | None
    add_bos: bool
    add_eos: bool
    eog_ids: list[int]            # llama.cpp's end-of-generation set
    stop_ids: list[int]           # the ones the GGUF itself types as control tokens: generation stops there
    chat_template: str | None


def read_vocab(path: Path) -> GGUFVocab:
    """The tokenizer metadata of a GGUF file (weights are not read)."""
    try:
        import gguf  # noqa: F401  lazy: the [export] extra
    except ImportError as exc:
        raise ModelSourceError(f"reading a GGUF tokenizer needs the gguf package (the [export] extra): {exc}") from exc
    try:
        reader = gguf_reader.read(path)
    except Exception as exc:  # the reader raises ValueError, struct errors, ... on a bad file
        raise ModelSourceError(f"cannot read GGUF {path}: {type(exc).__name__}: {str(exc).splitlines()[0][:160]}") \
            from exc
    kv = {}
    arrays = {}
    for key, f in reader.fields.items():
        if key.startswith("tokenizer."):
            if key in ("tokenizer.ggml.tokens", "tokenizer.ggml.token_type", "tokenizer.ggml.scores",
                       "tokenizer.ggml.merges"):
                arrays[key] = f.contents()
            elif key != "tokenizer.ggml.precompiled_charsmap":
                kv[key] = f.contents()
        elif key in ("general.architecture", "general.name"):
            kv[key] = f.contents()
    model = kv.get("tokenizer.ggml.model")
    if model is None or "tokenizer.ggml.tokens" not in arrays:
        raise ModelSourceError(f"GGUF {path.name} has no tokenizer (tokenizer.ggml.model / tokens missing)")
    tokens = list(arrays["tokenizer.ggml.tokens"])
    types = [int(t) for t in arrays.get("tokenizer.ggml.token_type", [NORMAL] * len(tokens))]
    scores = arrays.get("tokenizer.ggml.scores")
    return GGUFVocab(model=str(model), pre=kv.get("tokenizer.ggml.pre"), tokens=tokens, types=types,
                     scores=None if scores is None else [float(s) for s in scores],
                     merges=arrays.get("tokenizer.ggml.merges"), kv=kv)


def llama_cpp_types(v: GGUFVocab) -> tuple[list[int], dict[str, int | None], list[int]]:
    """Token types after llama.cpp's text-based rules (llama_vocab::impl::load): (types, ids found or
    given per BY_TEXT kind, end-of-generation ids before eos/eot are added)."""
    n, types = len(v.tokens), list(v.types)
    index = {t: i for i, t in enumerate(v.tokens)}

    def given(key):
        val = v.get(key)
        return int(val) if val is not None and 0 <= int(val) < n else None

    found: dict[str, int | None] = {}
    for key, texts in BY_TEXT.items():
        found[key] = given(key)
        if found[key] is None:
            found[key] = next((index[t] for t in texts if t in index), None)
            if found[key] is not None:
                types[found[key]] = CONTROL
    eog = {found[k] for k in ("fim_pad_token_id", "fim_rep_token_id", "fim_sep_token_id") if found[k] is not None}
    for t in EOG_TEXTS:
        if t in index:
            eog.add(index[t])
            types[index[t]] = CONTROL
    for t in ALWAYS_RENDERED:
        if t in index:
            types[index[t]] = USER_DEFINED
    texts = {v.tokens[i]: i for i in eog}
    if "<|end|>" in texts and (("<|return|>" in texts and "<|call|>" in texts)
                               or ("<|calls|>" in texts and "<|flush|>" in texts)):
        eog.discard(texts["<|end|>"])
        types[texts["<|end|>"]] = USER_DEFINED
    if "</s>" in texts and ("<|tool_response>" in texts or "<|plamo:eos|>" in texts):
        eog.discard(texts["</s>"])
        types[texts["</s>"]] = NORMAL
    return types, found, sorted(eog)


def special_tokens(v: GGUFVocab) -> SpecialTokens:
    """llama.cpp's special-token ids, add flags and end-of-generation set for this vocabulary."""
    n = len(v.tokens)
    spm = v.model == "llama"
    ids = {"bos": 1 if spm else None, "eos": 2 if spm else None, "unk": 0 if spm else None, "pad": None}
    for name, key in (("bos", "bos_token_id"), ("eos", "eos_token_id"), ("unk", "unknown_token_id"),
                      ("pad", "padding_token_id")):
        val = v.get(key)
        if val is not None and 0 <= int(val) < n:
            ids[name] = int(val)
        elif ids[name] is not None and ids[name] >= n:
            ids[name] = None
    _, found, eog = llama_cpp_types(v)
    eog = set(eog) | {i for i in (ids["eos"], found["eot_token_id"], found["eom_token_id"]) if i is not None}
    tpl = v.kv.get("tokenizer.chat_template")
    return SpecialTokens(bos_id=ids["bos"], eos_id=ids["eos"], eot_id=found["eot_token_id"], unk_id=ids["unk"],
                         pad_id=ids["pad"], add_bos=bool(v.get("add_bos_token", spm)),
                         add_eos=bool(v.get("add_eos_token", False)), eog_ids=sorted(eog),
                         stop_ids=sorted(i for i in eog if v.types[i] == CONTROL or i == ids["eos"]),
                         chat_template=str(tpl) if isinstance(tpl, str) and tpl.strip() else None)


# ----------------------------------------------------------------------------- building

def _spm_merges(v: GGUFVocab, vocab: dict[str, int]) -> list[tuple[str, str]]:
    """Every split of a mergeable token into two vocab pieces, ranked by the token's score (highest
    first; llama.cpp merges the highest-scoring pair), then by the pieces' ids."""
    scores = v.scores or [0.0] * len(v.tokens)
    order = sorted((i for i, t in enumerate(v.types) if t in (NORMAL, UNUSED)), key=lambda i: (-scores[i], i))
    merges: list[tuple[str, str]] = []
    for i in order:
        piece = v.tokens[i]
        local = [(piece[:k], piece[k:]) for k in range(1, len(piece)) if piece[:k] in vocab and piece[k:] in vocab]
        local.sort(key=lambda p: (vocab[p[0]], vocab[p[1]]))
        merges.extend(local)
    return merges


def _unique_vocab(v: GGUFVocab) -> dict[str, int]:
    vocab: dict[str, int] = {}
    for i, t in enumerate(v.tokens):
        vocab.setdefault(t if t else f"[EMPTY_{i}]", i)   # llama.cpp names empty tokens the same way
    if len(vocab) != len(v.tokens):
        raise ModelSourceError(f"GGUF vocabulary has {len(v.tokens) - len(vocab)} duplicate token texts")
    return vocab


def build_tokenizer(v: GGUFVocab, special: SpecialTokens | None = None):
    """A tokenizers.Tokenizer equivalent to llama.cpp's tokenizer of this GGUF vocabulary."""
    special = special or special_tokens(v)
    vocab = _unique_vocab(v)
    if v.model == "llama":
        unk = v.tokens[special.unk_id] if special.unk_id is not None else None
        tok = Tokenizer(models.BPE(vocab=vocab, merges=_spm_merges(v, vocab), unk_token=unk, byte_fallback=True,
                                   fuse_unk=False, dropout=None))
        norm = [normalizers.Replace(" ", SPACE)]
        dec = [decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
        if bool(v.get("add_space_prefix", True)):
            norm.insert(0, normalizers.Prepend(SPACE))
            dec.append(decoders.Strip(" ", 1, 0))
        tok.normalizer = normalizers.Sequence(norm)
        tok.decoder = decoders.Sequence(dec)
    elif v.model == "gpt2":
        pre = v.pre or "default"
        if pre not in PRE_TOKENIZERS:
            raise ModelSourceError(f"GGUF pre-tokenizer {pre!r} (tokenizer.ggml.pre) is not supported by edgespec's "
                                   f"converter; known: {', '.join(sorted(PRE_TOKENIZERS))}")
        if not v.merges:
            raise ModelSourceError("GGUF gpt2 tokenizer has no merges (tokenizer.ggml.merges)")
        regexes, ignore_merges = PRE_TOKENIZERS[pre]
        merges = [tuple(m.split(" ", 1)) for m in v.merges]
        tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, ignore_merges=ignore_merges, fuse_unk=False,
                                   byte_fallback=False, dropout=None))
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in regexes]
            + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        tok.decoder = decoders.ByteLevel()
    else:
        raise ModelSourceError(f"GGUF tokenizer model {v.model!r} (tokenizer.ggml.model) is not supported by "
                               "edgespec's converter; supported: llama (SentencePiece BPE), gpt2 (byte-level BPE)")
    types, _, _ = llama_cpp_types(v)
    added = [AddedToken(t, special=ty != USER_DEFINED, normalized=False, lstrip=False, rstrip=False,
                        single_word=False)
             for t, ty in zip(v.tokens, types) if ty in (CONTROL, USER_DEFINED, UNKNOWN) and t]
    tok.add_tokens(added)
    single, pairs = ["$A"], ["$A", "$B"]
    spec = []
    if special.add_bos and special.bos_id is not None:
        b = v.tokens[special.bos_id]
        single, pairs, spec = [b, *single], [b, "$A", b, "$B"], [(b, special.bos_id)]
    if special.add_eos and special.eos_id is not None:
        e = v.tokens[special.eos_id]
        single, pairs = [*single, e], [*pairs, e]
        spec = list(dict.fromkeys([*spec, (e, special.eos_id)]))
    if spec:
        tok.post_processor = processors.TemplateProcessing(single=single, pair=pairs, special_tokens=spec)
    return tok


# ----------------------------------------------------------------------------- files

def write_tokenizer(gguf: Path, out_dir: Path, extra: dict | None = None) -> dict:
    """Write tokenizer.json, tokenizer_config.json, special_tokens_map.json, chat_template.jinja (if
    the GGUF has one) and PROVENANCE_FILE into out_dir; returns the provenance record."""
    v = read_vocab(Path(gguf))
    sp = special_tokens(v)
    tok = build_tokenizer(v, sp)
    out_dir = Path(out_dir)
    tok.save(str(out_dir / "tokenizer.json"))

    def text(i):
        return None if i is None else v.tokens[i]

    names = {"bos_token": text(sp.bos_id), "eos_token": text(sp.eos_id), "unk_token": text(sp.unk_id),
             "pad_token": text(sp.pad_id)}
    names = {k: t for k, t in names.items() if t is not None}
    cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "add_bos_token": sp.add_bos, "add_eos_token": sp.add_eos,
           "clean_up_tokenization_spaces": False, "model_max_length": 1 << 30, **names}
    (out_dir / "special_tokens_map.json").write_text(json.dumps(names, indent=2, ensure_ascii=False) + "\n",
                                                      encoding="utf-8")
    stale = out_dir / "chat_template.jinja"
    stale.unlink(missing_ok=True)
    if sp.chat_template is not None:
        cfg["chat_template"] = sp.chat_template
        stale.write_text(sp.chat_template, encoding="utf-8")
    (out_dir / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n",
                                                   encoding="utf-8")
    for name in ("tokenizer.model", "vocab.json", "merges.txt", "added_tokens.json"):   # older converters' files
        (out_dir / name).unlink(missing_ok=True)
    prov = {"converter": CONVERTER, "version": CONVERTER_VERSION, "gguf": Path(gguf).name, "model": v.model,
            "pre": v.pre, "vocab_size": len(v.tokens), **asdict(sp), "chat_template": sp.chat_template is not None,
            **(extra or {})}
    (out_dir / PROVENANCE_FILE).write_text(json.dumps(prov, indent=2) + "\n", encoding="utf-8")
    return prov


def converted_here(hf_dir: Path) -> bool:
    """Whether hf_dir's tokenizer was written by this converter at its current version."""
    p = Path(hf_dir) / PROVENANCE_FILE
    try:
        prov = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return prov.get("converter") == CONVERTER and prov.get("version") == CONVERTER_VERSION
