"""Greedy identity on the Qwen pairs (marked long: not in CI; run by hand and reported).

Bundles: $EDGESPEC_BUNDLE_QWEN_CODER, $EDGESPEC_BUNDLE_QWEN_SMOLLM, $EDGESPEC_BUNDLE_QWEN_GEMMA, or
$EDGESPEC_BUNDLES/<pair> (default <edgespec cache>/bundles/<pair>). A pair with no bundle is skipped.

    EDGESPEC_BUNDLES=/work/bundles .venv/bin/pytest -m long tests/test_long_runtime.py
"""
import os
from pathlib import Path

import pytest

from edgespec.paths import cache_home
from edgespec.runtime import Bundle, SpeculativeDecoder
from test_real_smollm import _tie_report  # tests/ is on sys.path (conftest.py)

pytestmark = pytest.mark.long

PAIRS = ["qwen-coder", "qwen-smollm", "qwen-gemma"]
N_PROMPTS, N_TOKENS = 5, 64


def _bundle(pair: str) -> Path | None:
    env = os.environ.get("EDGESPEC_BUNDLE_" + pair.upper().replace("-", "_"))
    root = Path(os.environ.get("EDGESPEC_BUNDLES") or cache_home() / "bundles")
    for cand in ([Path(env)] if env else []) + [root / pair, *sorted(root.glob(pair + "-*"))]:
        if (cand / "manifest.json").is_file():
            return cand
    return None


@pytest.mark.parametrize("pair", PAIRS)
@pytest.mark.parametrize("k", [4])
def test_qwen_greedy_identity(pair, k):
    from edgespec.calibrate.prompts import load_prompts

    path = _bundle(pair)
    if path is None:
        pytest.skip(f"no {pair} bundle (set EDGESPEC_BUNDLE_{pair.upper().replace('-', '_')})")
    b = Bundle.load(path, verify="fast")
    spec = SpeculativeDecoder(b, strategy="tli", draft_length=k)
    ar = spec.variant("ar")
    for p in load_prompts("humaneval", split="test")[:N_PROMPTS]:
        ref = ar.generate(p.text, max_new_tokens=N_TOKENS)
        got = spec.generate(p.text, max_new_tokens=N_TOKENS)
        if got.token_ids != ref.token_ids:
            pytest.fail(f"{pair} {p.id} k={k}: " + _tie_report(b, ref.prompt_token_ids, ref.token_ids, got.token_ids))
        print(f"{pair} {p.id}: identical; {got.stats.summary()}")


TEXTS = ["def quicksort(items):\n    \"\"\"Sort.\"\"\"\n    if len(items) <= 1:\n        return items  # done\n",
         "Naïve café — “quotes” … €5; 日本語のテキスト 🙂🚀 Ελληνικά\n\n\ttabs   spaces",
         "<|im_start|>user\nWrite a function.<|im_end|>\n<|im_start|>assistant\n```python\nx = [i**2 for i in range(10)]\n```"]


@pytest.mark.parametrize("pair", ["qwen-smollm", "qwen-gemma"])
def test_real_hetero_drafter_context_is_byte_exact(pair):
    """Cheap (tokenizers only, no ONNX session): the drafter context spells the committed text exactly,
    token by token, including multi-byte characters split across Qwen's byte-level tokens, Gemma's ▁
    and <0xNN> byte fallback, and both drafters' BOS."""
    from edgespec.runtime.round.context import HeteroContext
    from edgespec.runtime.bundle.vocab import token_table

    path = _bundle(pair)
    if path is None:
        pytest.skip(f"no {pair} bundle")
    b = Bundle.load(path, verify="none")
    ctx = HeteroContext(b)
    t_keys = token_table(b.target.tokenizer, b.target.vocab_size).keys

    def spelled(keys, ids):
        return b"".join(k for k in (keys[i] or b"" for i in ids) if not k.startswith(b"special:"))

    resyncs = 0
    for text in TEXTS:
        ids = b.target.tokenizer.encode(text, add_special_tokens=False).ids
        ctx.start(ids)
        assert ctx.ids[0] == b.drafter.bos_id and spelled(ctx.d_keys, ctx.ids) == spelled(t_keys, ids)
        ctx.start(ids[:1])
        for i in range(1, len(ids)):
            before = list(ctx.ids)
            changed = ctx.append_target(ids[i])
            assert ctx.ids[:changed] == before[:changed]
            assert spelled(ctx.d_keys, ctx.ids) == spelled(t_keys, ids[:i + 1]), (text[:20], i)
        resyncs += ctx.resyncs
    assert resyncs > 0
