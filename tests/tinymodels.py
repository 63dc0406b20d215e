"""Tiny, randomly initialised models with real `tokenizers` tokenizers, built at test time with no
downloads, and exported into real bundles through edgespec's own export code.

Reusable outside the test suite (benchmarks' tests, examples):

    from tests.tinymodels import build_tiny_bundles
    paths = build_tiny_bundles(workdir)         # {"same": Path, "self": Path, "hetero": Path, ...}

Tokenizers (trained on a fixed few-KB text: English prose + Python code + some non-ASCII):
- "bytelevel": GPT-2-style byte-level BPE, vocab ~600, specials <|endoftext|> <|im_start|> <|im_end|>,
  ChatML template, adds no BOS (like Qwen).
- "spiece": SentencePiece-style BPE (Metaspace ▁, byte_fallback <0x00>..<0xFF>), vocab ~500,
  specials <unk> <s> </s> <pad> <start_of_turn> <end_of_turn>, Gemma-like template, adds <s> (BOS).

Models: LlamaForCausalLM (or a qwen2 / gemma3 twin: tiny_config), hidden 64, 2 layers, 4 heads,
2 KV heads, max_position 512. The model vocabulary is the tokenizer's rounded up to a multiple of 16
(like Qwen's padded embedding).
"""
from __future__ import annotations

import json
import os
import textwrap as _textwrap_module
from pathlib import Path

SEED = 0
HIDDEN = 64
LAYERS = 2
HEADS = 4
KV_HEADS = 2
MAX_POS = 512
INIT_RANGE = 0.2   # peaky enough that greedy decoding is not a coin toss

ENGLISH = """\
Speculative decoding lets a small drafter model propose several tokens which a larger target model
then verifies in a single forward pass. When the drafter guesses well, many tokens are accepted at
once and generation becomes faster, while the output distribution stays exactly the same.
On edge devices memory bandwidth is the bottleneck: every decode step reads all of the weights.
A pruned language-model head reads only the rows of the tokens it keeps, which makes the drafter
cheaper still. The quick brown fox jumps over the lazy dog. Pack my box with five dozen liquor jugs.
Naïve café owners in Zürich serve crème brûlée — “smart quotes”, ellipses… and the euro sign €.
日本語のテキストも少し含めます。 Ελληνικά γράμματα: α β γ δ. Emoji: 🙂 🚀.
The function returns a list of integers; each integer is an index into the vocabulary.
Please write a Python function that sorts a list of numbers using quicksort.
"""

CODE = '''\
def quicksort(items):
    """Return a new sorted list."""
    if len(items) <= 1:
        return list(items)
    pivot = items[len(items) // 2]
    left = [x for x in items if x < pivot]
    middle = [x for x in items if x == pivot]
    right = [x for x in items if x > pivot]
    return quicksort(left) + middle + quicksort(right)


class Counter:
    def __init__(self, start=0):
        self.value = start

    def increment(self, step=1):
        self.value += step
        return self.value


for i in range(10):
    print(f"{i}: {i * i}")
'''

BYTELEVEL_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
SPIECE_SPECIALS = ["<unk>", "<s>", "</s>", "<pad>", "<start_of_turn>", "<end_of_turn>"]

CHATML_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
GEMMA_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}{{ '<start_of_turn>' + message['role'] + '\\n' + message['content'] + "
    "'<end_of_turn>\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<start_of_turn>model\\n' }}{% endif %}"
)


def corpus() -> list[str]:
    """The fixed training text (a few KB): English, code and the start of the stdlib textwrap module."""
    try:
        src = Path(_textwrap_module.__file__).read_text(encoding="utf-8")[:6000]
    except OSError:
        src = ""
    lines = (ENGLISH + CODE + src).splitlines(keepends=True)
    return ["".join(lines[i:i + 4]) for i in range(0, len(lines), 4)]


def train_bytelevel(vocab_size: int = 600):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=BYTELEVEL_SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(corpus(), trainer=trainer)
    return tok


def train_spiece(vocab_size: int = 500):
    """SentencePiece-style BPE: Metaspace ▁ and byte fallback tokens <0x00>..<0xFF> in the vocab."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    n_bytes = 256
    learn = max(vocab_size - n_bytes, len(SPIECE_SPECIALS) + 100)
    base = Tokenizer(models.BPE(unk_token="<unk>"))
    base.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first")
    trainer = trainers.BpeTrainer(vocab_size=learn, special_tokens=SPIECE_SPECIALS, show_progress=False,
                                  limit_alphabet=200)
    base.train_from_iterator(corpus(), trainer=trainer)
    data = json.loads(base.to_str())
    learned = data["model"]["vocab"]          # token -> id, specials first
    merges = data["model"]["merges"]
    vocab: dict[str, int] = {}
    for s in SPIECE_SPECIALS:
        vocab[s] = len(vocab)
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    for t, _ in sorted(learned.items(), key=lambda kv: kv[1]):
        if t not in vocab:
            vocab[t] = len(vocab)
    merges = [tuple(m.split(" ", 1)) if isinstance(m, str) else tuple(m) for m in merges]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.add_special_tokens(SPIECE_SPECIALS)
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first")
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                       special_tokens=[("<s>", vocab["<s>"])])
    return tok


def tiny_tokenizers() -> dict:
    """{"bytelevel": Tokenizer, "spiece": Tokenizer} (trained fresh; deterministic)."""
    return {"bytelevel": train_bytelevel(), "spiece": train_spiece()}


def _hf_tokenizer(tok, kind: str):
    from transformers import PreTrainedTokenizerFast

    if kind == "bytelevel":
        return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|im_start|>", eos_token="<|im_end|>",
                                       pad_token="<|endoftext|>", unk_token="<|endoftext|>",
                                       chat_template=CHATML_TEMPLATE)
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                   unk_token="<unk>", chat_template=GEMMA_TEMPLATE,
                                   additional_special_tokens=["<start_of_turn>", "<end_of_turn>"])


def _special_ids(tok, kind: str) -> dict:
    if kind == "bytelevel":
        return {"bos": tok.token_to_id("<|im_start|>"), "eos": [tok.token_to_id("<|im_end|>"), tok.token_to_id("<|endoftext|>")],
                "pad": tok.token_to_id("<|endoftext|>")}
    return {"bos": tok.token_to_id("<s>"), "eos": [tok.token_to_id("</s>"), tok.token_to_id("<end_of_turn>")],
            "pad": tok.token_to_id("<pad>")}


# the recipes' architectures (models/*.toml `arch`) and their transformers classes
MODEL_CLASSES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "gemma3": "Gemma3ForCausalLM"}
ARCHS = tuple(MODEL_CLASSES)


def tiny_config(arch: str, vocab: int, hidden: int, layers: int, tie: bool, ids: dict):
    """A tiny HF config of `arch` with the attention layout of its recipe's model: llama (SmolLM2), qwen2
    (Qwen2.5-Coder: biased QKV projections) or gemma3 (Gemma-3: q/k norms, so the builder feeds query, key
    and value to attention apart, and sliding-window layers with every 6th global, window 8)."""
    from transformers import Gemma3TextConfig, LlamaConfig, Qwen2Config

    common = dict(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                  num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, max_position_embeddings=MAX_POS,
                  tie_word_embeddings=tie, bos_token_id=ids["bos"], eos_token_id=ids["eos"],
                  pad_token_id=ids["pad"], initializer_range=INIT_RANGE)
    if arch == "llama":
        return LlamaConfig(**common, rope_theta=10000.0)
    if arch == "qwen2":
        return Qwen2Config(**common, rope_theta=1e6)
    if arch == "gemma3":
        head_dim = hidden // HEADS
        return Gemma3TextConfig(**common, head_dim=head_dim, query_pre_attn_scalar=head_dim, sliding_window=8,
                                layer_types=["full_attention" if (i + 1) % 6 == 0 else "sliding_attention"
                                             for i in range(layers)],
                                rope_theta=1e6, rope_local_base_freq=1e4)
    raise ValueError(f"no tiny twin for architecture {arch!r}; have {', '.join(ARCHS)}")


def build_tiny_model(out_dir: str | Path, tok, kind: str, seed: int = SEED, tie: bool = False,
                     layers: int = LAYERS, hidden: int = HIDDEN, arch: str = "llama") -> Path:
    """Save a random causal LM of `arch` (tiny_config) + the tokenizer as an HF directory (skips if
    already there)."""
    out_dir = Path(out_dir)
    if (out_dir / "config.json").is_file() and (out_dir / "tokenizer.json").is_file():
        return out_dir
    import torch
    import transformers
    from transformers import GenerationConfig

    ids = _special_ids(tok, kind)
    n = tok.get_vocab_size(with_added_tokens=True)
    vocab = -(-n // 16) * 16
    cfg = tiny_config(arch, vocab, hidden, layers, tie, ids)
    torch.manual_seed(seed)
    model = getattr(transformers, MODEL_CLASSES[arch])(cfg).eval()
    tmp = out_dir.with_name(out_dir.name + ".tmp")
    model.save_pretrained(str(tmp))
    GenerationConfig(bos_token_id=ids["bos"], eos_token_id=ids["eos"], pad_token_id=ids["pad"]).save_pretrained(str(tmp))
    _hf_tokenizer(tok, kind).save_pretrained(str(tmp))
    os.replace(tmp, out_dir)
    return out_dir


def build_tiny_bundles(workdir: str | Path, which: tuple[str, ...] = ("same", "self", "hetero"),
                       progress: bool = False) -> dict:
    """Build the tiny HF models and export them into bundles under `workdir`; returns
    {"tokenizers": {...}, "models": {name: dir}, "<bundle>": Path}.

    - "same":   target tiny-bl-a, drafter tiny-bl-b (another random model, SAME tokenizer), head pruned to 3/4.
    - "self":   target and drafter both tiny-bl-a (acceptance ~1 under greedy), pruned to 3/4.
    - "hetero": target tiny-bl-a (byte-level), drafter tiny-sp (SentencePiece-style), pruned to 3/4.
    Exports are cached in workdir/onnx-cache (the user's cache is never touched)."""
    from edgespec.export.bundle_writer import export_bundle

    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    toks = tiny_tokenizers()
    models = {
        "tiny-bl-a": build_tiny_model(workdir / "hf" / "tiny-bl-a", toks["bytelevel"], "bytelevel", seed=1, tie=False),
        "tiny-bl-b": build_tiny_model(workdir / "hf" / "tiny-bl-b", toks["bytelevel"], "bytelevel", seed=2, tie=True),
        "tiny-sp": build_tiny_model(workdir / "hf" / "tiny-sp", toks["spiece"], "spiece", seed=3, tie=True),
    }
    cache = workdir / "onnx-cache"
    res: dict = {"tokenizers": toks, "models": models}
    specs = {"same": ("tiny-bl-a", "tiny-bl-b"), "self": ("tiny-bl-a", "tiny-bl-a"), "hetero": ("tiny-bl-a", "tiny-sp")}
    for name in which:
        t, d = specs[name]
        out = workdir / "bundles" / name
        if not (out / "manifest.json").is_file():
            n_d = json.loads((models[d] / "config.json").read_text())["vocab_size"]
            export_bundle(str(models[t]), str(models[d]), out, keep=(3 * n_d) // 4, pair=f"tiny-{name}",
                          progress=progress, cache=cache)
        res[name] = out
    return res
