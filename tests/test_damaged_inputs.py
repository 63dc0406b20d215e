"""Damaged input gets one line, never a traceback: prompt bytes that are not UTF-8, JSON nested past the
parser's depth in every file the runtime reads, a manifest's context length past what the graph holds,
a padded-attention graph ORT cannot load (profiled as such once, not retried at every generate)."""
from __future__ import annotations

import hashlib
import io
import json
import sys

import pytest

from edgespec.cli import main
from edgespec.errors import BundleError, GenerationError
from edgespec.runtime import Bundle, SpeculativeDecoder
from edgespec.runtime.planning import device_profile as dp

DEEP = "[" * 100_000 + "]" * 100_000


def _one_line(text: str) -> str:
    assert text.strip() and len(text.strip().splitlines()) == 1, text
    return text


def _manifest(b):
    return json.loads((b / "manifest.json").read_text())


def _write_manifest(b, m):
    (b / "manifest.json").write_text(json.dumps(m))


@pytest.mark.parametrize("data", [b"def f(\xff", b"caf\xc3", b"\xed\xa0\x80 surrogate"])
def test_a_prompt_on_stdin_that_is_not_utf8_is_refused_in_one_line(tiny_self_bundle, monkeypatch, capsys, data):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data), encoding="utf-8", errors="surrogateescape"))
    rc = main(["generate", "--bundle", str(tiny_self_bundle), "--prompt", "-", "--max-new-tokens", "2",
               "--threads", "1"])
    err = capsys.readouterr().err
    assert rc == 2 and "not UTF-8" in _one_line(err), err


def test_the_same_bytes_as_utf8_run(tiny_self_bundle, monkeypatch, capsys):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO("def f(é):".encode()), encoding="latin-1"))
    rc = main(["generate", "--bundle", str(tiny_self_bundle), "--prompt", "-", "--max-new-tokens", "2",
               "--threads", "1"])
    assert rc == 0, capsys.readouterr().err                  # read as UTF-8 whatever the locale says


@pytest.mark.parametrize("prompt", ["def f(\udcff", "a \ud800 b"])
def test_a_lone_surrogate_in_a_prompt_or_a_message_is_a_generation_error(tiny_self_bundle, prompt):
    dec = SpeculativeDecoder(Bundle.load(tiny_self_bundle), strategy="ar", threads=1)
    with pytest.raises(GenerationError, match="not valid text") as exc:
        dec.generate(prompt, max_new_tokens=2)
    _one_line(str(exc.value))
    with pytest.raises(GenerationError, match="not valid text"):
        dec.generate([{"role": "user", "content": prompt}], max_new_tokens=2, chat=True)


def test_a_deep_manifest_is_one_line(tiny_self_bundle, copy_bundle):
    b = copy_bundle(tiny_self_bundle)
    (b / "manifest.json").write_text(DEEP)
    with pytest.raises(BundleError, match="nested too deeply") as exc:
        Bundle.load(b)
    _one_line(str(exc.value))


def test_a_deep_vocab_file_is_one_line(tiny_self_bundle, copy_bundle):
    b = copy_bundle(tiny_self_bundle)
    m = _manifest(b)
    (b / "vocab" / "vocab.json").write_text(DEEP)
    data = (b / "vocab" / "vocab.json").read_bytes()
    m["files"]["vocab/vocab.json"] = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    _write_manifest(b, m)
    with pytest.raises(BundleError) as exc:
        Bundle.load(b)
    assert "vocab" in _one_line(str(exc.value))


def test_a_deep_digest_memory_means_hashing_again(tiny_self_bundle, monkeypatch, tmp_path):
    import edgespec.hashing as H
    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path))
    (tmp_path / H.DIGEST_CACHE).write_text(DEEP)
    hashed = []
    real = H.sha256_file
    monkeypatch.setattr(H, "sha256_file", lambda p, *a, **k: hashed.append(p) or real(p, *a, **k))
    Bundle.load(tiny_self_bundle)
    assert len(hashed) == len(_manifest(tiny_self_bundle)["files"])


def test_a_deep_device_profile_is_measured_again_in_one_line(tiny_self_bundle, monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path))
    b = Bundle.load(tiny_self_bundle)
    path = dp.profile_path(dp.profile_key(b, 1))
    path.parent.mkdir(parents=True)
    path.write_text(DEEP)
    assert dp.load_profile(b, 1) is None
    err = capsys.readouterr().err
    assert "damaged" in _one_line(err) and "measured again" in err
    profile, measured = dp.ensure_profile(b, 1)
    assert measured and dp.load_profile(b, 1) is not None


def test_a_context_length_no_graph_holds_is_refused(tiny_self_bundle, copy_bundle):
    b = copy_bundle(tiny_self_bundle)
    m = _manifest(b)
    m["target"]["max_position"] = 10 ** 30
    _write_manifest(b, m)
    with pytest.raises(BundleError, match="max_position must be an integer in") as exc:
        Bundle.load(b)
    _one_line(str(exc.value))


def test_a_prompt_past_the_graphs_positions_is_one_line_and_keeps_the_decoder(tiny_self_bundle, copy_bundle):
    """The manifest claims 4096 positions; the graph's rotary cache holds 512: ORT's failure is one line,
    and the decoder serves the next call."""
    b = copy_bundle(tiny_self_bundle)
    m = _manifest(b)
    held = m["target"]["max_position"]
    m["target"]["max_position"] = 4096
    _write_manifest(b, m)
    dec = SpeculativeDecoder(Bundle.load(b), strategy="ar", threads=1)
    with pytest.raises(GenerationError, match="ONNX Runtime failed at position") as exc:
        dec.generate(list(range(3, 3 + held + 8)), max_new_tokens=2)
    _one_line(str(exc.value))
    ok = SpeculativeDecoder(Bundle.load(tiny_self_bundle), strategy="ar", threads=1)
    assert dec.generate("The quick brown", max_new_tokens=6).token_ids == \
        ok.generate("The quick brown", max_new_tokens=6).token_ids


def test_an_unloadable_padded_graph_is_profiled_once_as_such(tiny_same_bundle, copy_bundle, monkeypatch, tmp_path):
    """padded_attention.onnx replaced by other bytes with its digest rewritten (it passes the file check):
    the profile says it cannot be loaded, plans on model.onnx, and the next decoder reuses that profile."""
    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path))
    b = copy_bundle(tiny_same_bundle)
    m = _manifest(b)
    rel = "target/padded_attention.onnx"
    assert rel in m["files"]
    (b / rel).write_bytes(b"not a graph" * 100)
    data = (b / rel).read_bytes()
    m["files"][rel] = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    _write_manifest(b, m)
    bundle = Bundle.load(b)
    profile, measured = dp.ensure_profile(bundle, 1)
    assert measured and "cannot be loaded here" in profile.graphs["padded_attention"].note
    assert profile.graphs["model"].measured
    _, plan = dp.plan_for(bundle, 1)
    assert plan.step_graph == "model"
    again, measured = dp.ensure_profile(Bundle.load(b), 1)
    assert not measured and again.graphs["padded_attention"].note == profile.graphs["padded_attention"].note
