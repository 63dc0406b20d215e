"""runtime/bundle/bundle.py: loading, validation, hash/corruption/version errors."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from edgespec.errors import BundleError
from edgespec.runtime import Bundle


def test_load_attributes(tiny_same_bundle):
    b = Bundle.load(tiny_same_bundle)
    m = b.manifest
    assert m["format"] == "edgespec-bundle" and m["format_version"] == 1
    assert b.target.onnx.is_file() and b.drafter.onnx.is_file()
    assert b.kept == m["vocab"]["kept"] == m["drafter"]["kept"]
    assert b.index_map.dtype == np.int64 and b.draft_ids.dtype == np.int64
    assert b.drafter_to_target.shape == (m["drafter"]["vocab_size"],)
    assert b.target_to_drafter.shape == (m["target"]["vocab_size"],)
    assert np.array_equal(b.index_map, b.drafter_to_target[b.draft_ids])
    assert b.target.tokenizer.get_vocab_size() > 100 and b.drafter.tokenizer is not None
    assert b.chat_template and "<|im_start|>" in b.chat_template
    assert b.target.eos_ids and b.target.bos_id is not None
    assert {"index_map", "draft_ids", "logits"} <= set(b.drafter.io["outputs"])
    assert b.prior is None and b.affinity is None and b.a_star is None
    assert b.vocab["format"] == "edgespec-vocab"
    for rel, meta in m["files"].items():
        assert (tiny_same_bundle / rel).stat().st_size == meta["bytes"]


@pytest.mark.parametrize("mode", ["fast", "none"])
def test_verify_modes_change_what_is_hashed_not_what_is_loaded(tiny_hetero_bundle, mode):
    full, b = Bundle.load(tiny_hetero_bundle, verify="full"), Bundle.load(tiny_hetero_bundle, verify=mode)
    assert b.manifest == full.manifest and b.kept == full.kept and b.same_tokenizer == full.same_tokenizer
    for name in ("index_map", "draft_ids", "drafter_to_target", "target_to_drafter"):
        assert np.array_equal(getattr(b, name), getattr(full, name)), name
    assert b.target.tokenizer.to_str() == full.target.tokenizer.to_str()
    assert b.drafter.tokenizer.to_str() == full.drafter.tokenizer.to_str()


def test_bad_verify_mode(tiny_self_bundle):
    with pytest.raises(BundleError, match="verify"):
        Bundle.load(tiny_self_bundle, verify="quick")


def _flip_byte(path, pos=-100):
    data = bytearray(path.read_bytes())
    data[pos] ^= 0xFF
    path.write_bytes(bytes(data))


def test_corrupt_file_detected(tiny_same_bundle, copy_bundle):
    b = copy_bundle(tiny_same_bundle)
    _flip_byte(b / "drafter" / "model.onnx")
    with pytest.raises(BundleError, match=r"drafter/model.onnx is corrupt \(sha256"):
        Bundle.load(b, verify="full")
    Bundle.load(b, verify="none")  # the caller may opt out of hashing


def test_fast_mode_catches_same_size_corruption_of_the_weights(tiny_same_bundle, copy_bundle, monkeypatch, tmp_path):
    """The default verify hashes the graphs' weights too: bits flipped in the middle of a file, its size and
    mtime put back, are refused in one line, though the unchanged file had been remembered as good."""
    import edgespec.hashing as H
    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(H, "_SETTLED_NS", 0)
    b = copy_bundle(tiny_same_bundle)
    Bundle.load(b)                                     # remembered
    data = b / "target" / "model.onnx"
    st = data.stat()
    time.sleep(0.05)
    _flip_byte(data, pos=st.st_size // 2)
    os.utime(data, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert data.stat().st_size == st.st_size
    with pytest.raises(BundleError, match=r"target/model.onnx is corrupt \(sha256 mismatch\)$"):
        Bundle.load(b)
    with open(data, "ab") as f:
        f.write(b"x")
    with pytest.raises(BundleError, match=r"target/model.onnx is corrupt \(size"):
        Bundle.load(b, verify="fast")


def test_full_mode_reads_every_file_again(tiny_same_bundle, copy_bundle, monkeypatch, tmp_path):
    """"full" ignores the digest memory: a file whose bytes changed under unchanged metadata (as media rot
    would; here the memory is made to hold a wrong digest) is caught by "full", not by "fast"."""
    import edgespec.hashing as H
    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(H, "_SETTLED_NS", 0)
    b = copy_bundle(tiny_same_bundle)
    Bundle.load(b)
    cache = tmp_path / "home" / H.DIGEST_CACHE
    doc = json.loads(cache.read_text())
    key = str((b / "drafter" / "model.onnx").resolve())
    doc[key]["sha256"] = "0" * 64                      # what a rotted file would hash to, say
    cache.write_text(json.dumps(doc))
    with pytest.raises(BundleError, match="drafter/model.onnx is corrupt"):
        Bundle.load(b, verify="fast")                  # trusts the memory: the listed digest differs
    hashed = []
    real = H.sha256_file
    monkeypatch.setattr(H, "sha256_file", lambda p, *a, **k: hashed.append(Path(p).name) or real(p, *a, **k))
    Bundle.load(b, verify="full")                      # reads the file: its bytes are the listed ones
    assert "model.onnx" in hashed and len(hashed) == len(_listed(b))
    hashed.clear()
    Bundle.load(b, verify="fast")                      # "full" put the right digest back
    assert hashed == []


def _listed(b):
    return json.loads((b / "manifest.json").read_text())["files"]


def test_small_file_corruption_caught_in_fast_mode(tiny_same_bundle, copy_bundle):
    b = copy_bundle(tiny_same_bundle)
    arr = np.load(b / "vocab" / "index_map.npy")
    arr[0] = (arr[0] + 1) % 7
    np.save(b / "vocab" / "index_map.npy", arr)
    with pytest.raises(BundleError, match="index_map.npy is corrupt"):
        Bundle.load(b, verify="fast")


@pytest.mark.parametrize("rel", ["drafter/model.onnx", "target/tokenizer.json", "vocab/draft_ids.npy"])
def test_missing_file(tiny_same_bundle, copy_bundle, rel):
    b = copy_bundle(tiny_same_bundle)
    (b / rel).unlink()
    with pytest.raises(BundleError, match=f"missing file {rel}"):
        Bundle.load(b, verify="none")


def test_version_mismatch(tiny_same_bundle, copy_bundle):
    b = copy_bundle(tiny_same_bundle)
    m = json.loads((b / "manifest.json").read_text())
    m["format_version"] = 99
    (b / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(BundleError, match="format_version 99"):
        Bundle.load(b)


def test_not_a_bundle(tmp_path):
    with pytest.raises(BundleError, match="does not exist"):
        Bundle.load(tmp_path / "nope")
    (tmp_path / "d").mkdir()
    with pytest.raises(BundleError, match="manifest.json is missing"):
        Bundle.load(tmp_path / "d")
    (tmp_path / "d" / "manifest.json").write_text("{not json")
    with pytest.raises(BundleError, match="corrupt"):
        Bundle.load(tmp_path / "d")
    (tmp_path / "d" / "manifest.json").write_text(json.dumps({"format": "something-else"}))
    with pytest.raises(BundleError, match="not an edgespec bundle"):
        Bundle.load(tmp_path / "d")


def test_missing_io_names(tiny_same_bundle, copy_bundle):
    b = copy_bundle(tiny_same_bundle)
    m = json.loads((b / "manifest.json").read_text())
    m["drafter"]["io"]["outputs"].remove("index_map")
    (b / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(BundleError, match="index_map"):
        Bundle.load(b)


def test_onnx_io_matches_manifest(tiny_hetero_bundle):
    import onnxruntime as ort

    b = Bundle.load(tiny_hetero_bundle)
    for side in (b.target, b.drafter):
        s = ort.InferenceSession(str(side.onnx), providers=["CPUExecutionProvider"])
        assert [i.name for i in s.get_inputs()] == side.io["inputs"]
        assert [o.name for o in s.get_outputs()] == side.io["outputs"]


def test_runtime_imports_no_torch():
    code = ("import sys; import edgespec.runtime, edgespec.runtime.bundle.bundle, edgespec.runtime.bundle.vocab; "
            "bad = [m for m in ('torch', 'transformers', 'optimum') if m in sys.modules]; "
            "print(bad); sys.exit(1 if bad else 0)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_affinity_csr_is_checked_once_and_padded():
    from edgespec.runtime.samplers.rdk import Affinity
    m = Affinity.from_csr(np.array([0.25, 0.75, 1.0], np.float32), np.array([0, 2, 1]), np.array([0, 2, 3]), (2, 3))
    assert m.padded_data.tolist() == [[0.25, 0.75], [1.0, 0.0]] and m.padded_indices.tolist() == [[0, 2], [1, 0]]
    for bad in (dict(indices=np.array([0.0, 2.0, 1.0])),                 # float column ids
                dict(data=np.array([0.5, 0.75, 1.0])),                   # row 0 sums to 1.25
                dict(indptr=np.array([0, 3, 2]))):                       # decreasing pointers
        args = dict(data=np.array([0.25, 0.75, 1.0]), indices=np.array([0, 2, 1]), indptr=np.array([0, 2, 3]),
                    shape=(2, 3))
        with pytest.raises(BundleError, match="affinity M"):
            Affinity.from_csr(**{**args, **bad})


def test_fast_verify_remembers_digests_of_unchanged_files(tiny_same_bundle, copy_bundle, monkeypatch, tmp_path):
    """A second load of an unchanged bundle reads no file; any write to a file makes it hashed again,
    even with its size and mtime put back (ctime moves), and a just-written file is never remembered."""
    import edgespec.hashing as H
    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path / "home"))
    b = copy_bundle(tiny_same_bundle)
    Bundle.load(b, verify="fast")              # files written < 2 s ago: hashed, not remembered
    assert not (tmp_path / "home" / H.DIGEST_CACHE).exists()
    monkeypatch.setattr(H, "_SETTLED_NS", 0)
    Bundle.load(b, verify="fast")
    assert (tmp_path / "home" / H.DIGEST_CACHE).is_file()
    hashed = []
    real = H.sha256_file
    monkeypatch.setattr(H, "sha256_file", lambda p, *a, **k: hashed.append(Path(p).name) or real(p, *a, **k))
    Bundle.load(b, verify="fast")
    assert hashed == []
    onnx = b / "drafter" / "model.onnx"
    st = onnx.stat()
    time.sleep(0.05)
    _flip_byte(onnx)
    os.utime(onnx, ns=(st.st_atime_ns, st.st_mtime_ns))      # size and mtime as before
    with pytest.raises(BundleError, match=r"drafter/model.onnx is corrupt \(sha256"):
        Bundle.load(b, verify="fast")
    assert hashed == ["model.onnx"]


def test_unwritable_digest_cache_still_verifies(tiny_same_bundle, copy_bundle, monkeypatch, tmp_path):
    import edgespec.hashing as H
    home = tmp_path / "home"
    home.write_text("a file where the cache directory should be")
    monkeypatch.setenv("EDGESPEC_HOME", str(home))
    monkeypatch.setattr(H, "_SETTLED_NS", 0)
    b = copy_bundle(tiny_same_bundle)
    Bundle.load(b, verify="fast")
    _flip_byte(b / "drafter" / "model.onnx")
    with pytest.raises(BundleError, match="corrupt"):
        Bundle.load(b, verify="fast")


def test_a_remembered_tokenizer_is_parsed_on_first_use(tiny_same_bundle, copy_bundle, monkeypatch, tmp_path):
    """A tokenizer.json that parsed and passed the checks at an earlier load of the same, unchanged file
    is parsed on first use (then once for a pair sharing it); the decoder parses it while ORT builds the
    target's session. A verify='none' load, and a first load, parse it at load."""
    import edgespec.hashing as H
    from tokenizers import Tokenizer
    from edgespec.runtime import SpeculativeDecoder
    from edgespec.runtime.engine.sessions import create_sessions

    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(H, "_SETTLED_NS", 0)
    b = copy_bundle(tiny_same_bundle)
    first = Bundle.load(b)
    assert first.target.tokenizer_file.parsed
    assert Bundle.load(b, verify="none").target.tokenizer_file.parsed
    again = Bundle.load(b)
    assert not again.target.tokenizer_file.parsed and again.drafter.tokenizer_file is again.target.tokenizer_file
    fresh = Tokenizer.from_file(str(b / "target" / "tokenizer.json"))
    assert again.target.tokenizer.encode("hello world 123").ids == fresh.encode("hello world 123").ids
    assert again.target.tokenizer_file.parsed

    dec = SpeculativeDecoder(Bundle.load(b), strategy="tli", threads=1)
    assert dec.bundle.target.tokenizer_file.parsed
    order = []
    made = create_sessions([dict(model_path=b / "target" / "model.onnx", threads=1, role="target")],
                           beside=lambda: order.append("beside"))
    assert order == ["beside"] and len(made) == 1


def test_sessions_fail_before_beside(tiny_same_bundle, tmp_path):
    from edgespec.runtime.engine.sessions import create_sessions

    bad = tmp_path / "model.onnx"
    bad.write_bytes(b"not a graph")

    def boom():
        raise RuntimeError("beside failed")

    with pytest.raises(BundleError, match="target: ONNX Runtime cannot load"):
        create_sessions([dict(model_path=bad, threads=1, role="target")], beside=boom)
    with pytest.raises(RuntimeError, match="beside failed"):
        create_sessions([dict(model_path=tiny_same_bundle / "target" / "model.onnx", threads=1, role="target")],
                        beside=boom)


def test_an_interrupted_check_is_never_remembered(tiny_same_bundle, copy_bundle, monkeypatch, tmp_path):
    """Ctrl-C while a file is hashed: nothing about it is saved, and the next load hashes it (and refuses
    it where it is damaged)."""
    import edgespec.hashing as H
    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(H, "_SETTLED_NS", 0)
    b = copy_bundle(tiny_same_bundle)
    _flip_byte(b / "target" / "model.onnx")
    real = H.sha256_file

    def interrupted(p, *a, **k):
        if Path(p).name == "model.onnx":
            raise KeyboardInterrupt
        return real(p, *a, **k)

    monkeypatch.setattr(H, "sha256_file", interrupted)
    with pytest.raises(KeyboardInterrupt):
        Bundle.load(b)
    assert not H.DigestMemory().remembers(b / "target" / "model.onnx")
    monkeypatch.setattr(H, "sha256_file", real)
    with pytest.raises(BundleError, match="model.onnx is corrupt"):
        Bundle.load(b)
