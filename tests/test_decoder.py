"""The decode loop on the tiny bundles: greedy identity with `ar`, streaming, stopping, stats,
seeded reproducibility, chat, and every bad input of the runtime-core issue."""
import hashlib
import json

import numpy as np
import pytest

from edgespec.errors import BundleError, EPError, GenerationError
from edgespec.runtime import Bundle, SpeculativeDecoder

PROMPTS = ["def quicksort(items):\n    ", "The quick brown fox", "Naïve café owners in Zürich serve"]
N = 32


@pytest.fixture(scope="module")
def bundles(tiny_same_bundle, tiny_self_bundle, tiny_hetero_bundle):
    return {"same": Bundle.load(tiny_same_bundle), "self": Bundle.load(tiny_self_bundle),
            "hetero": Bundle.load(tiny_hetero_bundle)}


@pytest.fixture(scope="module")
def ar_outputs(bundles):
    out = {}
    for name, b in bundles.items():
        dec = SpeculativeDecoder(b, strategy="ar", threads=1)
        out[name] = [dec.generate(p, max_new_tokens=N).token_ids for p in PROMPTS]
    return out


@pytest.mark.parametrize("name", ["same", "self", "hetero"])
@pytest.mark.parametrize("k", [1, 4, 8])
def test_greedy_identity_with_ar(bundles, ar_outputs, name, k):
    dec = SpeculativeDecoder(bundles[name], strategy="tli", draft_length=k, threads=1)
    for prompt, expect in zip(PROMPTS, ar_outputs[name]):
        res = dec.generate(prompt, max_new_tokens=N)
        assert res.token_ids == expect, (name, k, prompt)
        st = res.stats
        assert st.new_tokens == len(res.token_ids) <= N
        assert st.target_forwards == 1 + st.verify_forwards
        assert st.accepted <= st.drafted and st.drafted == sum(st.drafted_per_step)
        assert st.tau * st.verify_forwards == pytest.approx(st.new_tokens - 1)
        assert st.overhead_ms >= 0 and st.total_ms >= st.prefill_ms + st.draft_ms + st.verify_ms - 1e-6


def test_sd_equals_tli_on_same_tokenizer(bundles, ar_outputs):
    dec = SpeculativeDecoder(bundles["same"], strategy="sd", draft_length=3, threads=1)
    assert dec.generate(PROMPTS[0], max_new_tokens=N).token_ids == ar_outputs["same"][0]
    tli = SpeculativeDecoder(bundles["same"], strategy="tli", draft_length=3, threads=1)
    a = dec.generate(PROMPTS[1], max_new_tokens=N, temperature=1.0, seed=11)
    b = tli.generate(PROMPTS[1], max_new_tokens=N, temperature=1.0, seed=11)
    assert a.token_ids == b.token_ids


def test_hetero_drafter_context_is_resynced(bundles):
    from edgespec.runtime.bundle.vocab import token_table

    b = bundles["hetero"]
    dec = SpeculativeDecoder(b, strategy="tli", draft_length=4, threads=1)
    for prompt in PROMPTS:
        res = dec.generate(prompt, max_new_tokens=N)
        assert res.stats.drafter_resyncs > 0
        # the drafter's context spells exactly the committed bytes, in its own tokens (BOS/specials aside)
        t_keys = token_table(b.target.tokenizer, b.target.vocab_size).keys
        d_keys = token_table(b.drafter.tokenizer, b.drafter.vocab_size).keys
        text = lambda keys, ids: b"".join(k for k in (keys[i] or b"" for i in ids) if not k.startswith(b"special:"))
        ctx = dec.last_generation.drafter_ctx
        assert ctx.ids[0] == b.drafter.bos_id
        assert text(d_keys, ctx.ids) == text(t_keys, res.prompt_token_ids + res.token_ids)


@pytest.mark.parametrize("name", ["same", "hetero"])
def test_seeded_sampling_is_reproducible(bundles, name):
    dec = SpeculativeDecoder(bundles[name], strategy="tli", draft_length=3, threads=1)
    kw = dict(max_new_tokens=N, temperature=1.0, top_k=50, top_p=0.95)
    a = dec.generate(PROMPTS[0], seed=123, **kw)
    b = dec.generate(PROMPTS[0], seed=123, **kw)
    assert a.token_ids == b.token_ids and a.text == b.text
    others = {tuple(dec.generate(PROMPTS[0], seed=s, **kw).token_ids) for s in range(5)}
    assert len(others) > 1          # the seed matters (5 equal 32-token samples at T=1 would be absurd)


@pytest.mark.parametrize("temperature,draft_probability", [(0.0, None), (1.0, None), (1.0, 0.5)])
def test_sampler_time_is_booked_inside_overhead(bundles, temperature, draft_probability):
    """sampler_ms (drafter logits -> q) is measured for every draft, and it is part of the non-ORT overhead."""
    dec = SpeculativeDecoder(bundles["hetero"], strategy="tli", draft_length=3, threads=1,
                             draft_probability=draft_probability)
    st = dec.generate(PROMPTS[0], max_new_tokens=N, temperature=temperature, seed=1).stats
    assert st.drafted > 0 and 0 < st.sampler_ms <= st.overhead_ms
    assert st.sampler_share == st.sampler_ms / st.draft_ms
    ar = SpeculativeDecoder(bundles["hetero"], strategy="ar", threads=1).generate(PROMPTS[0], max_new_tokens=4)
    assert ar.stats.sampler_ms == 0.0 and ar.stats.sampler_share is None


@pytest.mark.parametrize("name", ["self", "hetero"])
def test_stream_concatenates_to_the_text(bundles, name):
    dec = SpeculativeDecoder(bundles[name], strategy="tli", draft_length=4, threads=1)
    for prompt in PROMPTS:
        deltas = list(dec.stream(prompt, max_new_tokens=N, temperature=1.0, seed=5))
        res = dec.last_result
        assert "".join(deltas) == res.text
        assert all(isinstance(d, str) and d for d in deltas)
        assert all(d.encode("utf-8").decode("utf-8") == d for d in deltas)
        assert res.text == bundles[name].target.tokenizer.decode(res.token_ids, skip_special_tokens=True)
        assert res.token_ids == dec.generate(prompt, max_new_tokens=N, temperature=1.0, seed=5).token_ids


def test_stream_interrupted_then_new_call_works(bundles, ar_outputs):
    dec = SpeculativeDecoder(bundles["same"], strategy="tli", draft_length=4, threads=1)
    it = dec.stream(PROMPTS[0], max_new_tokens=N)
    next(it)
    next(it)
    it.close()
    assert dec.last_result.stats.stop_reason == "interrupted"
    assert dec.generate(PROMPTS[1], max_new_tokens=N).token_ids == ar_outputs["same"][1]
    # a stream abandoned without close() and then superseded refuses to continue
    old = dec.stream(PROMPTS[0], max_new_tokens=N)
    next(old)
    assert dec.generate(PROMPTS[2], max_new_tokens=N).token_ids == ar_outputs["same"][2]
    with pytest.raises(GenerationError, match="superseded"):
        list(old)
    assert dec.last_result.token_ids == ar_outputs["same"][2]


def test_stop_string(bundles, ar_outputs):
    b = bundles["same"]
    full = b.target.tokenizer.decode(ar_outputs["same"][0], skip_special_tokens=True)
    stop = full[12:15]
    pos = full.find(stop)
    dec = SpeculativeDecoder(b, strategy="tli", draft_length=8, threads=1)
    res = dec.generate(PROMPTS[0], max_new_tokens=N, stop=[stop, "\x00never"])
    assert res.stats.stop_reason == "stop"
    assert res.text == full[:pos]
    ids = res.token_ids
    assert ids == ar_outputs["same"][0][:len(ids)]
    assert stop in b.target.tokenizer.decode(ids) and stop not in b.target.tokenizer.decode(ids[:-1])
    streamed = "".join(dec.stream(PROMPTS[0], max_new_tokens=N, stop=stop))
    assert streamed == full[:pos]


def test_eos_ends_generation_mid_block(bundles, ar_outputs):
    ref = ar_outputs["self"][0]
    dec = SpeculativeDecoder(bundles["self"], strategy="tli", draft_length=8, threads=1)
    eos = ref[6]
    dec.shared.eos_ids = frozenset({eos})  # pretend this token is the end-of-sequence token
    res = dec.generate(PROMPTS[0], max_new_tokens=N)
    assert res.stats.stop_reason == "eos"
    assert res.token_ids == ref[:ref.index(eos) + 1]


@pytest.mark.parametrize("m", [1, 2, 3, 9])
def test_max_new_tokens_is_never_exceeded(bundles, m):
    dec = SpeculativeDecoder(bundles["self"], strategy="tli", draft_length=8, threads=1)
    dec.shared.eos_ids = frozenset()
    for t in (0.0, 1.0):
        res = dec.generate(PROMPTS[1], max_new_tokens=m, temperature=t, seed=1)
        assert len(res.token_ids) == m and res.stats.stop_reason == "length"


def test_prompt_as_ids_and_chat(bundles):
    b = bundles["same"]
    dec = SpeculativeDecoder(b, strategy="tli", draft_length=2, threads=1)
    ids = b.target.tokenizer.encode(PROMPTS[1]).ids
    assert dec.generate(ids, max_new_tokens=8).token_ids == dec.generate(PROMPTS[1], max_new_tokens=8).token_ids
    res = dec.generate("Sort a list.", max_new_tokens=8, chat=True)
    expect = "<|im_start|>user\nSort a list.<|im_end|>\n<|im_start|>assistant\n"
    assert res.prompt_token_ids == b.target.tokenizer.encode(expect, add_special_tokens=False).ids
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    res = dec.generate(msgs, max_new_tokens=4, chat=True)
    assert b.target.tokenizer.decode(res.prompt_token_ids, skip_special_tokens=False).startswith("<|im_start|>system")


def test_chat_on_hetero_bundle_maps_specials(bundles):
    dec = SpeculativeDecoder(bundles["hetero"], strategy="tli", draft_length=3, threads=1)
    res = dec.generate("Sort a list.", max_new_tokens=8, chat=True)
    assert res.stats.new_tokens == len(res.token_ids) >= 1


# ---------------------------------------------------------------------------------------- bad input

@pytest.mark.parametrize("kwargs,err,match", [
    (dict(strategy="nope"), GenerationError, "unknown strategy"),
    (dict(draft_length=0), GenerationError, "draft_length"),
    (dict(draft_length=-2), GenerationError, "draft_length"),
    (dict(draft_length=2.5), GenerationError, "draft_length"),
    (dict(ep="npu"), EPError, "unknown execution provider"),
    (dict(draft_probability=1.5), GenerationError, "draft_probability"),
    (dict(draft_probability="auto"), GenerationError, "a\\*"),
])
def test_bad_decoder_arguments(tiny_same_bundle, kwargs, err, match):
    with pytest.raises(err, match=match):
        SpeculativeDecoder(tiny_same_bundle, **{"threads": 1, **kwargs})


def test_sd_on_heterogeneous_bundle(tiny_hetero_bundle):
    with pytest.raises(GenerationError, match="same-tokenizer"):
        SpeculativeDecoder(tiny_hetero_bundle, strategy="sd", threads=1)


@pytest.mark.parametrize("prompt,kwargs,match", [
    ("hello", dict(temperature=-0.5), "temperature"),
    ("hello", dict(top_p=0.0), "top_p"),
    ("hello", dict(top_p=1.01), "top_p"),
    ("hello", dict(top_k=0), "top_k"),
    ("", {}, "empty prompt"),
    ([], {}, "empty prompt"),
    ([10**7], {}, "out of range"),
    (3.5, {}, "prompt must be"),
    ("hello", dict(max_new_tokens=0), "max_new_tokens"),
    ("hello", dict(max_new_tokens=600), "context length"),
    ("hello " * 300, dict(max_new_tokens=300), "context length"),
    ("hello", dict(stop=[""]), "stop"),
    ("hello", dict(chat=True, prompt_override=[{"content": "x"}]), "chat=True"),
])
def test_bad_generation_input(bundles, prompt, kwargs, match):
    dec = SpeculativeDecoder(bundles["same"], strategy="tli", draft_length=2, threads=1)
    kwargs = dict(kwargs)
    prompt = kwargs.pop("prompt_override", prompt)
    with pytest.raises(GenerationError, match=match):
        dec.generate(prompt, **kwargs)
    with pytest.raises(GenerationError, match=match):
        dec.stream(prompt, **kwargs)          # checked at the call, not at the first next()
    assert dec.generate("hello", max_new_tokens=2).stats.new_tokens == 2   # still usable


def test_chat_without_template(bundles):
    b = Bundle.load(bundles["same"].path, verify="none")
    b.target.chat_template = None
    dec = SpeculativeDecoder(b, strategy="ar", threads=1)
    with pytest.raises(GenerationError, match="no chat template"):
        dec.generate("hi", chat=True)


def test_corrupt_bundle(tiny_same_bundle, copy_bundle):
    path = copy_bundle(tiny_same_bundle)
    onnx = path / "drafter" / "model.onnx"
    onnx.write_bytes(onnx.read_bytes()[:1000])
    with pytest.raises(BundleError):
        SpeculativeDecoder(path, threads=1)


def _rewrite(path, rel, arr):
    np.save(path / rel, arr)
    m = json.loads((path / "manifest.json").read_text())
    data = (path / rel).read_bytes()
    m["files"][rel] = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    (path / "manifest.json").write_text(json.dumps(m))


def test_mismatched_bundle(tiny_same_bundle, copy_bundle):
    """vocab/index_map.npy from a different export than the drafter graph (hashes made consistent)."""
    path = copy_bundle(tiny_same_bundle)
    im = np.load(path / "vocab" / "index_map.npy")
    _rewrite(path, "vocab/index_map.npy", np.roll(im, 1))
    with pytest.raises(BundleError, match="mismatched"):
        SpeculativeDecoder(path, strategy="tli", threads=1, options={"defer_drafter": False})
    dec = SpeculativeDecoder(path, strategy="tli", threads=1)       # deferred: found at the first draft
    with pytest.raises(BundleError, match="mismatched") as exc:
        dec.generate("hello", max_new_tokens=8)
    assert "\n" not in str(exc.value)


def test_mismatched_target_graph(tiny_same_bundle, copy_bundle):
    """A manifest that claims a different layer count than the target graph has."""
    path = copy_bundle(tiny_same_bundle)
    m = json.loads((path / "manifest.json").read_text())
    m["target"]["num_layers"] = 3
    (path / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(BundleError, match="layers"):
        SpeculativeDecoder(path, strategy="ar", threads=1)


def test_variants_share_sessions_and_decode_like_fresh_decoders(bundles, ar_outputs):
    base = SpeculativeDecoder(bundles["hetero"], strategy="tli", draft_length=2, threads=1)
    ar = base.variant("ar")
    tli6 = base.variant(draft_length=6)
    assert ar.target is base.target and tli6.drafter is base.drafter and ar.drafter is None
    assert ar.generate(PROMPTS[0], max_new_tokens=N).token_ids == ar_outputs["hetero"][0]
    kw = dict(max_new_tokens=N, temperature=1.0, seed=4)
    fresh = SpeculativeDecoder(bundles["hetero"], strategy="tli", draft_length=6, threads=1)
    assert tli6.generate(PROMPTS[1], **kw).token_ids == fresh.generate(PROMPTS[1], **kw).token_ids
    assert tli6.last_result.stats.draft_length == 6 and base.last_result is None
    old = base.stream(PROMPTS[0], max_new_tokens=N)
    next(old)
    tli6.generate(PROMPTS[2], max_new_tokens=4)          # a variant's call supersedes the base's stream
    with pytest.raises(GenerationError, match="superseded"):
        list(old)
    with pytest.raises(GenerationError, match="needs a drafter session"):
        SpeculativeDecoder(bundles["self"], strategy="ar", threads=1).variant("tli")
