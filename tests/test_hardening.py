"""Bad input and concurrent use of the API: one-line EdgespecErrors, never wrong text."""
import threading

import numpy as np
import pytest

from edgespec.errors import EdgespecError, EPError, GenerationError
from edgespec.runtime import Bundle, SpeculativeDecoder

PROMPTS = ["The quick brown", "def add(a, b):", "Once upon a time", "1, 2, 3,"]


@pytest.fixture(scope="module")
def dec(tiny_self_bundle):
    return SpeculativeDecoder(Bundle.load(tiny_self_bundle), strategy="tli", draft_length=3, threads=1)


def test_threads_sharing_one_decoder_get_their_own_correct_text(dec):
    """Calls on one decoder (and its variants) are serialised: each thread gets the text a lone call gives."""
    ar = dec.variant("ar")
    want = {p: ar.generate(p, max_new_tokens=16).token_ids for p in PROMPTS}
    got, errors = {}, []

    def work(i):
        try:
            d = dec if i % 2 else ar
            for p in PROMPTS:
                got[(i, p)] = d.generate(p, max_new_tokens=16).token_ids
        except Exception as exc:            # noqa: BLE001 (recorded and asserted below)
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert all(ids == want[p] for (_, p), ids in got.items()) and len(got) == 4 * len(PROMPTS)


def test_a_stream_superseded_by_another_thread_says_so(dec):
    """A call that starts between two steps of a stream supersedes it: the stream's next step raises a
    clear error; the other call's text is right."""
    want = dec.variant("ar").generate(PROMPTS[1], max_new_tokens=12).token_ids
    stream = dec.stream(PROMPTS[0], max_new_tokens=40)
    next(stream)
    other = {}
    t = threading.Thread(target=lambda: other.setdefault("ids", dec.generate(PROMPTS[1], max_new_tokens=12).token_ids))
    t.start()
    t.join()
    assert other["ids"] == want
    with pytest.raises(GenerationError, match="superseded"):
        for _ in stream:
            pass


@pytest.mark.parametrize("kwargs, match", [
    (dict(draft_length=1_000_000), "draft_length must be an integer in"),
    (dict(draft_length=2.5), "draft_length"),
    (dict(options={"rdk_betta": 1000}), "did you mean 'rdk_beta'"),
    (dict(options={"concurrent_draft": "no"}), "concurrent_draft"),
])
def test_bad_decoder_arguments(tiny_self_bundle, kwargs, match):
    with pytest.raises(GenerationError, match=match):
        SpeculativeDecoder(tiny_self_bundle, strategy="tli", threads=1, **{"draft_length": 3, **kwargs})


@pytest.mark.parametrize("kwargs", [dict(threads=0), dict(options={"draft_threads": 2.0}), dict(threads=True)])
def test_bad_thread_counts_refused_before_the_bundle_loads(tmp_path, kwargs):
    # the path does not exist: a thread check that ran after Bundle.load would raise BundleError instead
    with pytest.raises(EPError, match="threads must be a whole number"):
        SpeculativeDecoder(tmp_path / "missing", strategy="tli", draft_length=3, **kwargs)


@pytest.mark.parametrize("prompt, match", [
    (["1", "2"], "integers"),
    ([[1, 2], [3]], "integers"),
    ([1.0, 2.0], "integers"),
    ([True, 1], "integers"),
    ([10**9], "out of range"),
    ([], "empty prompt"),
    ("", "empty prompt"),
    (3.5, "must be a str"),
])
def test_bad_prompts(dec, prompt, match):
    with pytest.raises(GenerationError, match=match):
        dec.generate(prompt, max_new_tokens=4)


def test_numpy_token_ids_are_accepted(dec):
    ids = dec.encode_prompt(PROMPTS[0])
    assert dec.generate(np.asarray(ids), max_new_tokens=4).token_ids == dec.generate(ids, max_new_tokens=4).token_ids


def test_errors_are_one_line_edgespec_errors(dec):
    for bad in (dict(max_new_tokens=0), dict(stop=[""]), dict(temperature=-1)):
        with pytest.raises(EdgespecError) as info:
            dec.generate(PROMPTS[0], **{"max_new_tokens": 4, **bad})
        assert "\n" not in str(info.value)


@pytest.mark.parametrize("messages, template, match", [
    ([{"role": "user", "content": 5}], None, "content must be a str"),
    ([{"role": "robot", "content": "hi"}], None, "role must be one of"),
    ("hi", "{% for i in range(10**12) %}x{% endfor %}", "failed to render"),
    ("hi", "{{ raise_exception('nope') }}", "nope"),
])
def test_bad_chat_input(dec, messages, template, match):
    from edgespec.runtime.bundle.chat import as_messages, render_chat

    with pytest.raises(GenerationError, match=match) as info:
        render_chat(template or "{{ messages[0]['content'] }}", as_messages(messages))
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("args, match", [
    (["--temperature", "-1"], "temperature"),
    (["--seed", "-1"], "seed must be an integer >= 0"),
    (["--draft-length", "1000000"], "draft_length must be an integer in"),
    (["--top-p", "0"], "top_p"),
    (["--max-new-tokens", "0"], "max_new_tokens"),
    (["--draft-probability", "2"], "draft_probability must be in (0, 1]"),
])
def test_cli_checks_arguments_before_loading_the_bundle(tmp_path, capsys, args, match):
    """The bundle path does not exist: an argument error must come first, as one line."""
    from edgespec.cli import main

    rc = main(["generate", "--bundle", str(tmp_path / "missing"), "--prompt", "hi", *args])
    err = capsys.readouterr().err.strip()
    assert rc != 0 and match in err and len(err.splitlines()) == 1, err


@pytest.mark.parametrize("kwargs, match", [
    (dict(seed=-1), "seed"), (dict(seed="7"), "seed"), (dict(seed=1.5), "seed"),
    (dict(top_p="0.9", temperature=1.0), "top_p"), (dict(top_k=2.5, temperature=1.0), "top_k"),
    (dict(temperature="hot"), "temperature"),
])
def test_bad_sampling_arguments(dec, kwargs, match):
    with pytest.raises(GenerationError, match=match):
        dec.generate(PROMPTS[0], max_new_tokens=4, **kwargs)


def test_a_tiny_temperature_is_refused_not_a_crash(dec):
    with pytest.raises(GenerationError, match="temperature must be 0"):
        dec.generate(PROMPTS[0], max_new_tokens=4, temperature=1e-300)


def test_nan_logits_raise_a_one_line_error_naming_the_graph(tiny_self_bundle, copy_bundle):
    """A graph whose weights hold NaN (here the target's final norm) must not yield text."""
    import onnx
    from onnx import numpy_helper

    b = copy_bundle(tiny_self_bundle)
    path = b / "target" / "model.onnx"
    model = onnx.load(str(path))
    norms = [t for t in model.graph.initializer if "norm" in t.name.lower() and len(t.dims) == 1]
    final = norms[-1]
    final.CopyFrom(numpy_helper.from_array(np.full(numpy_helper.to_array(final).shape, np.nan, np.float32), final.name))
    data = path.parent / "model.onnx.data"
    if data.exists():
        data.unlink()
        onnx.save(model, str(path), save_as_external_data=True, location=data.name)
    else:
        onnx.save(model, str(path))
    dec = SpeculativeDecoder(Bundle.load(b, verify="none"), strategy="tli", draft_length=3, threads=1)
    with pytest.raises(GenerationError, match="the target graph returned NaN or inf logits") as info:
        dec.generate(PROMPTS[0], max_new_tokens=4)
    assert "\n" not in str(info.value)
