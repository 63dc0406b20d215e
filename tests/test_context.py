"""The heterogeneous drafter context (runtime/round/context.py) on the tiny hetero bundle: byte-level BPE
target (no BOS), SentencePiece-style drafter (▁, <0xNN> byte fallback, adds <s>)."""
import pytest

from edgespec.runtime import Bundle
from edgespec.runtime.round.context import HeteroContext
from edgespec.runtime.bundle.vocab import token_table

TEXTS = ["Naïve café owners in Zürich", "日本語のテキスト 🙂🚀", "def f(x):\n    return x  # ok", " leading space",
         "<|im_start|>user\nhi<|im_end|>"]


@pytest.fixture(scope="module")
def setup(tiny_hetero_bundle):
    b = Bundle.load(tiny_hetero_bundle)
    t_keys = token_table(b.target.tokenizer, b.target.vocab_size).keys
    d_keys = token_table(b.drafter.tokenizer, b.drafter.vocab_size).keys

    def spelled(keys, ids):
        return b"".join(k for k in (keys[i] or b"" for i in ids) if not k.startswith(b"special:"))

    return b, lambda ids: spelled(t_keys, ids), lambda ids: spelled(d_keys, ids)


@pytest.mark.parametrize("text", TEXTS)
def test_prompt_conversion_is_byte_exact_with_drafter_bos(setup, text):
    b, t_bytes, d_bytes = setup
    ctx = HeteroContext(b)
    ids = b.target.tokenizer.encode(text).ids
    ctx.start(ids)
    assert ctx.ids[0] == b.drafter.bos_id                       # the drafter adds <s>; the target adds nothing
    assert d_bytes(ctx.ids) == t_bytes(ids)
    assert ctx.resyncs == 0


@pytest.mark.parametrize("text", TEXTS)
def test_appending_token_by_token_stays_byte_exact(setup, text):
    """Every prefix, including ones ending inside a multi-byte character (a byte-level token of 'é' or
    '🙂'), is spelled exactly; a resync only rewrites tokens at or after the index it returns."""
    b, t_bytes, d_bytes = setup
    ctx = HeteroContext(b)
    ids = b.target.tokenizer.encode(text).ids
    ctx.start(ids[:1])
    for i in range(1, len(ids)):
        before = list(ctx.ids)
        changed = ctx.append_target(ids[i])
        assert ctx.ids[:changed] == before[:changed]
        assert d_bytes(ctx.ids) == t_bytes(ids[:i + 1]), (text, i)


def test_specials_map_by_content_or_are_dropped(setup):
    b, _, _ = setup
    ctx = HeteroContext(b)
    im_start = b.target.tokenizer.token_to_id("<|im_start|>")
    assert b.target_to_drafter[im_start] == -1                  # no such special in the drafter
    ctx.start([im_start])
    assert ctx.ids == [b.drafter.bos_id]
    assert ctx.append_target(im_start) == len(ctx.ids)          # dropped: nothing changes


def test_resync_happens_for_tokens_the_drafter_lacks(setup):
    b, t_bytes, d_bytes = setup
    ctx = HeteroContext(b)
    ids = b.target.tokenizer.encode(" ".join(TEXTS)).ids
    unmapped = [i for i in ids if b.target_to_drafter[i] < 0]
    assert unmapped, "the tiny tokenizers should disagree somewhere"
    ctx.start(ids[:1])
    for t in ids[1:]:
        ctx.append_target(t)
    specials = token_table(b.target.tokenizer).special
    assert ctx.resyncs == sum(1 for t in ids[1:] if b.target_to_drafter[t] < 0 and t not in specials) > 0
    assert d_bytes(ctx.ids) == t_bytes(ids)
