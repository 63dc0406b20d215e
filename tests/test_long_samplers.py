"""The paper samplers on the Qwen pairs (marked long: not in CI; run by hand and reported).

Bundles as in test_long_runtime.py ($EDGESPEC_BUNDLE_<PAIR> or $EDGESPEC_BUNDLES/<pair>).

    EDGESPEC_BUNDLES=/work/bundles .venv/bin/pytest -m long tests/test_long_samplers.py
"""
import pytest

from edgespec.runtime import Bundle, SpeculativeDecoder
from test_long_runtime import TEXTS, _bundle  # tests/ is on sys.path (conftest.py)
from test_real_smollm import _tie_report

pytestmark = pytest.mark.long

N_PROMPTS, N_TOKENS = 5, 64


def _load(pair):
    path = _bundle(pair)
    if path is None:
        pytest.skip(f"no {pair} bundle (set EDGESPEC_BUNDLE_{pair.upper().replace('-', '_')})")
    return Bundle.load(path, verify="fast")


@pytest.mark.parametrize("pair", ["qwen-smollm", "qwen-gemma"])
def test_slem_proposals_spell_the_drafted_text(pair):
    """Tokenizers only: Qwen's re-tokenisation of the drafter's tokens continues the committed text
    byte for byte, at every split point of the test texts."""
    from edgespec.runtime.round.slem import SlemTranslator
    from edgespec.runtime.bundle.vocab import token_table

    b = _load(pair)
    tr = SlemTranslator(b.target.tokenizer, b.drafter.tokenizer, b.drafter_to_target,
                        b.target.vocab_size, b.drafter.vocab_size)
    keys = token_table(b.target.tokenizer, b.target.vocab_size).keys
    drafter_side = SlemTranslator(b.drafter.tokenizer, b.drafter.tokenizer, b.target_to_drafter)  # its encode_bytes
    for text in TEXTS[:2]:
        ids = b.target.tokenizer.encode(text, add_special_tokens=False).ids
        for cut in range(1, len(ids)):
            committed = ids[:cut]
            draft = drafter_side.encode_bytes(b"".join(keys[i] for i in ids[cut:]))
            got = b"".join(keys[i] for i in committed + tr.propose(committed, draft).ids)
            assert got == text.encode(), (pair, cut, got)


@pytest.mark.parametrize("pair", ["qwen-smollm", "qwen-gemma"])
def test_slem_greedy_identity(pair):
    from edgespec.calibrate.prompts import load_prompts

    b = _load(pair)
    spec = SpeculativeDecoder(b, strategy="slem", draft_length=4)
    ar = spec.variant("ar")
    for p in load_prompts("humaneval", split="test")[:N_PROMPTS]:
        ref = ar.generate(p.text, max_new_tokens=N_TOKENS)
        got = spec.generate(p.text, max_new_tokens=N_TOKENS)
        if got.token_ids != ref.token_ids:
            pytest.fail(f"{pair} {p.id}: " + _tie_report(b, ref.prompt_token_ids, ref.token_ids, got.token_ids))
        print(f"{pair} {p.id}: identical; {got.stats.summary()}; realignments {got.stats.slem_realignments}")
