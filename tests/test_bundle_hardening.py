"""Bad bundles and bad inputs from the audit: every one is a one-line EdgespecError.

Manifest paths that escape the bundle, unlisted files, symlinks out of the bundle, a tokenizer that is
not the one exported (vocab_hash), what the default check covers, malformed manifests, stale export
temp directories, and `calibrate --out` into a new directory."""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from edgespec.cli import main
from edgespec.errors import BundleError, CalibrationError, EdgespecError
from edgespec.export import bundle_writer as BW
from edgespec.export import workdirs as WD
from edgespec.runtime import Bundle

RAW = str(Path(__file__).resolve().parent / "tinymodels.py")


def _one_line(exc) -> str:
    msg = str(exc.value if hasattr(exc, "value") else exc)
    assert msg and "\n" not in msg, msg
    return msg


def _manifest(b: Path) -> dict:
    return json.loads((b / "manifest.json").read_text())


def _write_manifest(b: Path, m: dict) -> None:
    (b / "manifest.json").write_text(json.dumps(m))


def _list(m: dict, b: Path, rel: str) -> None:
    """List (or re-list) BUNDLE/REL in the manifest with its true size and sha256: file hashing passes."""
    data = (b / rel).read_bytes()
    m["files"][rel] = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}


def _set(m: dict, key: str, value) -> None:
    node = m
    *parents, last = key.split(".")
    for k in parents:
        if k == "affinity":                    # vocab.affinity.path: the affinity entry is an object
            node["affinity"] = {"path": value}
            return
        node = node[k]
    node[last] = value


PATH_KEYS = ["target.onnx", "drafter.onnx", "vocab.prior", "vocab.affinity.path", "vocab.randomised",
             "vocab.vocab_file"]


# --------------------------------------------------------------------------- 1. paths that escape the bundle

@pytest.mark.parametrize("key", PATH_KEYS)
@pytest.mark.parametrize("how", ["dotdot", "absolute", "symlink"])
def test_manifest_path_outside_the_bundle(tiny_self_bundle, copy_bundle, tmp_path, key, how):
    b = copy_bundle(tiny_self_bundle)
    outside = tmp_path / "outside.onnx"           # beside the bundle: b/../outside.onnx
    outside.write_bytes((b / "target" / "model.onnx").read_bytes())
    m = _manifest(b)
    if how == "dotdot":
        value = "../outside.onnx"
    elif how == "absolute":
        value = "/etc/hostname"
    else:                                          # a listed file, hashes right, that is a symlink out
        (b / "target" / "evil.onnx").symlink_to(outside)
        _list(m, b, "target/evil.onnx")
        value = "target/evil.onnx"
    _set(m, key, value)
    _write_manifest(b, m)
    with pytest.raises(BundleError, match="outside the bundle") as exc:
        Bundle.load(b, verify="full")
    _one_line(exc)


@pytest.mark.parametrize("key", PATH_KEYS)
def test_manifest_path_not_listed_in_files(tiny_self_bundle, copy_bundle, key):
    """A file inside the bundle that the manifest names but does not list was never hashed: refused."""
    b = copy_bundle(tiny_self_bundle)
    (b / "vocab" / "extra.bin").write_bytes(b"never hashed")
    m = _manifest(b)
    _set(m, key, "vocab/extra.bin")
    _write_manifest(b, m)
    with pytest.raises(BundleError, match="not listed in the manifest's files") as exc:
        Bundle.load(b, verify="full")
    _one_line(exc)


@pytest.mark.parametrize("verify", ["full", "fast", "none"])
def test_listed_file_symlinked_outside(tiny_self_bundle, copy_bundle, tmp_path, verify):
    """target/tokenizer.json replaced by a symlink to an identical copy outside: hashes pass, still refused."""
    b = copy_bundle(tiny_self_bundle)
    outside = tmp_path / "tokenizer.json"
    outside.write_bytes((b / "target" / "tokenizer.json").read_bytes())
    (b / "target" / "tokenizer.json").unlink()
    (b / "target" / "tokenizer.json").symlink_to(outside)
    with pytest.raises(BundleError, match="outside the bundle") as exc:
        Bundle.load(b, verify=verify)
    _one_line(exc)


def test_unlisted_symlink_outside(tiny_self_bundle, copy_bundle):
    b = copy_bundle(tiny_self_bundle)
    (b / "vocab" / "etc").symlink_to("/etc")
    with pytest.raises(BundleError, match="vocab/etc' is a symlink to .*outside the bundle") as exc:
        Bundle.load(b, verify="none")
    _one_line(exc)


def test_symlink_inside_the_bundle_is_fine(tiny_self_bundle, copy_bundle, tmp_path):
    b = copy_bundle(tiny_self_bundle)
    (b / "target" / "tokenizer-alias.json").symlink_to("tokenizer.json")
    m = _manifest(b)
    _list(m, b, "target/tokenizer-alias.json")
    _write_manifest(b, m)
    Bundle.load(b, verify="full")
    link = tmp_path / "link-to-bundle"             # the bundle directory itself may be reached through a symlink
    link.symlink_to(b)
    Bundle.load(link, verify="full")


def test_listed_file_path_with_dotdot(tiny_self_bundle, copy_bundle):
    b = copy_bundle(tiny_self_bundle)
    m = _manifest(b)
    m["files"]["target/../../x"] = {"sha256": "0" * 64, "bytes": 0}
    _write_manifest(b, m)
    with pytest.raises(BundleError, match="bad file path") as exc:
        Bundle.load(b, verify="none")
    _one_line(exc)


# --------------------------------------------------------------------------- 2. the tokenizer's vocab_hash

def test_swapped_tokenizer_fails_vocab_hash(tiny_hetero_bundle, copy_bundle):
    b = copy_bundle(tiny_hetero_bundle)
    (b / "drafter" / "tokenizer.json").write_bytes((b / "target" / "tokenizer.json").read_bytes())
    m = _manifest(b)
    _list(m, b, "drafter/tokenizer.json")            # file hashing passes
    _write_manifest(b, m)
    with pytest.raises(BundleError, match=r"drafter/tokenizer.json is not the drafter tokenizer .*vocab_hash") as exc:
        Bundle.load(b, verify="full")
    _one_line(exc)


def test_same_tokenizer_flag_must_match_the_hashes(tiny_hetero_bundle, copy_bundle):
    b = copy_bundle(tiny_hetero_bundle)
    m = _manifest(b)
    m["same_tokenizer"] = True
    _write_manifest(b, m)
    with pytest.raises(BundleError, match="same_tokenizer") as exc:
        Bundle.load(b)
    _one_line(exc)


# --------------------------------------------------------------------------- 3. what the default check covers

def _flip(path: Path, pos: int = -1) -> None:
    data = bytearray(path.read_bytes())
    data[pos] ^= 0x01
    path.write_bytes(bytes(data))


def test_default_checks_catch_a_flipped_byte_in_index_map(tiny_self_bundle, copy_bundle, capsys):
    b = copy_bundle(tiny_self_bundle)
    _flip(b / "vocab" / "index_map.npy")
    for kwargs in ({}, {"verify": "fast"}):            # the API's default ("full") and the CLI's ("fast")
        with pytest.raises(BundleError, match=r"vocab/index_map.npy is corrupt \(sha256") as exc:
            Bundle.load(b, **kwargs)
        _one_line(exc)
    rc = main(["generate", "--bundle", str(b), "--prompt", "x", "--max-new-tokens", "1", "--threads", "1"])
    err = capsys.readouterr().err
    assert rc == 2 and "index_map.npy is corrupt" in err and len(err.strip().splitlines()) == 1, err


def test_fast_hashes_every_file(tiny_self_bundle, copy_bundle):
    """Under "fast" (the default), a same-size change to any listed file is refused in one line."""
    b = copy_bundle(tiny_self_bundle)
    files = _manifest(b)["files"]
    for rel, meta in files.items():
        if meta["bytes"] == 0:
            continue
        original = (b / rel).read_bytes()
        _flip(b / rel, pos=len(original) // 2)
        with pytest.raises(BundleError, match=f"{rel} is corrupt") as exc:
            Bundle.load(b, verify="fast")
        _one_line(exc)
        (b / rel).write_bytes(original)
    Bundle.load(b, verify="fast")


# --------------------------------------------------------------------------- 7. malformed manifests

def _edit(fn):
    def apply(b: Path) -> None:
        m = _manifest(b)
        fn(m)
        _write_manifest(b, m)
    return apply


def _raw(data: bytes):
    return lambda b: (b / "manifest.json").write_bytes(data)


MALFORMED = {
    "truncated": (lambda b: (b / "manifest.json").write_bytes((b / "manifest.json").read_bytes()[:300]), "corrupt"),
    "json list": (_raw(b"[1, 2, 3]"), "not a JSON object"),
    "not utf-8": (_raw(b'{"format": "edgespec-bundle\xff\xfe"}'), "corrupt"),
    "empty": (_raw(b""), "corrupt"),
    "format_version 99": (_edit(lambda m: m.update(format_version=99)), "format_version 99"),
    "format_version true": (_edit(lambda m: m.update(format_version=True)), "format_version True"),
    "vocab_size string": (_edit(lambda m: m["target"].update(vocab_size="608")), "target.vocab_size"),
    "vocab_size null": (_edit(lambda m: m["drafter"].update(vocab_size=None)), "drafter.vocab_size"),
    "vocab_size float": (_edit(lambda m: m["drafter"].update(vocab_size=2.5)), "drafter.vocab_size"),
    "kept negative": (_edit(lambda m: m["vocab"].update(kept=-1)), "vocab.kept"),
    "kept zero": (_edit(lambda m: m["vocab"].update(kept=0)), "vocab.kept"),
    "kept huge": (_edit(lambda m: m["vocab"].update(kept=10**12)), "K=1000000000000"),
    "files entry missing": (_edit(lambda m: m["files"].pop("vocab/draft_ids.npy")), "required file vocab/draft_ids"),
    "vocab.json unlisted": (_edit(lambda m: m["files"].pop("vocab/vocab.json")), "not listed"),
    "chat template unlisted": (_edit(lambda m: m["files"].pop("target/chat_template.jinja")), "not listed"),
    "files not an object": (_edit(lambda m: m.update(files=[])), "lacks 'files'"),
    "files entry null": (_edit(lambda m: m["files"].update({"vocab/vocab.json": None})), "files\\['vocab/vocab.json'\\]"),
    "files bytes string": (_edit(lambda m: m["files"]["vocab/vocab.json"].update(bytes="12")), "'bytes'"),
    "files empty key": (_edit(lambda m: m["files"].update({"": {"sha256": "0" * 64, "bytes": 0}})), "files key"),
    "files key newline": (_edit(lambda m: m["files"].update({"a\nb": {"sha256": "0" * 64, "bytes": 0}})), "files key"),
    "tokenizer null": (_edit(lambda m: m["target"].update(tokenizer=None)), "target.tokenizer"),
    "eos_ids string": (_edit(lambda m: m["target"]["tokenizer"].update(eos_ids="2")), "eos_ids"),
    "bos_id float": (_edit(lambda m: m["drafter"]["tokenizer"].update(bos_id=1.5)), "bos_id"),
    "vocab_hash missing": (_edit(lambda m: m["drafter"]["tokenizer"].pop("vocab_hash")), "vocab_hash"),
    "io a list": (_edit(lambda m: m["target"].update(io=["input_ids"])), "target.io"),
    "onnx a number": (_edit(lambda m: m["target"].update(onnx=3)), "target.onnx"),
    "same_tokenizer string": (_edit(lambda m: m.update(same_tokenizer="yes")), "same_tokenizer"),
    "affinity without path": (_edit(lambda m: m["vocab"].update(affinity={"rows": 3})), "vocab.affinity"),
    "randomised a list": (_edit(lambda m: m["vocab"].update(randomised=[0.5])), "vocab.randomised"),
    "num_layers string": (_edit(lambda m: m["target"].update(num_layers="2")), "target.num_layers"),
    "max_position zero": (_edit(lambda m: m["target"].update(max_position=0)), "target.max_position"),
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_malformed_manifest(tiny_self_bundle, copy_bundle, case):
    b = copy_bundle(tiny_self_bundle)
    corrupt, match = MALFORMED[case]
    corrupt(b)
    with pytest.raises(BundleError, match=match) as exc:
        Bundle.load(b, verify="none")
    _one_line(exc)


def test_malformed_manifest_through_the_cli(tiny_self_bundle, copy_bundle, capsys):
    b = copy_bundle(tiny_self_bundle)
    _edit(lambda m: m["vocab"].update(kept="many"))(b)
    rc = main(["generate", "--bundle", str(b), "--prompt", "x", "--max-new-tokens", "1", "--threads", "1"])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("edgespec: error: ") and "vocab.kept" in err
    assert len(err.strip().splitlines()) == 1, err


def _priors_bundle(src: Path, copy_bundle, prior=None, randomised=None, affinity=None) -> Path:
    """A copy of `src` with priors written into vocab/ and listed, so file hashing passes."""
    b = copy_bundle(src)
    m = _manifest(b)
    if prior is not None:
        np.save(b / "vocab" / "prior.npy", prior)
        _list(m, b, "vocab/prior.npy")
        m["vocab"]["prior"] = "vocab/prior.npy"
    if randomised is not None:
        (b / "vocab" / "randomised.json").write_text(json.dumps(randomised))
        _list(m, b, "vocab/randomised.json")
        m["vocab"]["randomised"] = "vocab/randomised.json"
    if affinity is not None:
        np.savez(b / "vocab" / "affinity.npz", **affinity)
        _list(m, b, "vocab/affinity.npz")
        m["vocab"]["affinity"] = {"path": "vocab/affinity.npz"}
    _write_manifest(b, m)
    return b


def test_good_priors_load(tiny_self_bundle, copy_bundle):
    v_t = _manifest(tiny_self_bundle)["target"]["vocab_size"]
    k = _manifest(tiny_self_bundle)["vocab"]["kept"]
    b = _priors_bundle(tiny_self_bundle, copy_bundle, prior=np.full(v_t, 1 / v_t, np.float32),
                       randomised={"a_star": 0.5, "lambda": 0.2},
                       affinity={"data": np.ones(k, np.float32), "indices": np.arange(k, dtype=np.int32),
                                 "indptr": np.arange(k + 1, dtype=np.int64), "shape": np.array([k, v_t])})
    bundle = Bundle.load(b)
    assert bundle.a_star == 0.5 and bundle.prior.shape == (v_t,) and bundle.affinity.shape == (k, v_t)


@pytest.mark.parametrize("what", ["prior nan", "prior 2-D", "a_star 3", "a_star string", "affinity index",
                                  "affinity indptr", "affinity not npz"])
def test_bad_priors(tiny_self_bundle, copy_bundle, what):
    v_t = _manifest(tiny_self_bundle)["target"]["vocab_size"]
    k = _manifest(tiny_self_bundle)["vocab"]["kept"]
    good_m = {"data": np.ones(k, np.float32), "indices": np.arange(k, dtype=np.int32),
              "indptr": np.arange(k + 1, dtype=np.int64), "shape": np.array([k, v_t])}
    kw = {"prior nan": {"prior": np.full(v_t, np.nan, np.float32)},
          "prior 2-D": {"prior": np.ones((v_t, 1), np.float32)},
          "a_star 3": {"randomised": {"a_star": 3}},
          "a_star string": {"randomised": {"a_star": "0.5"}},
          "affinity index": {"affinity": {**good_m, "indices": np.full(k, v_t + 5, np.int32)}},
          "affinity indptr": {"affinity": {**good_m, "indptr": np.arange(k + 1, dtype=np.int64)[::-1].copy()}},
          "affinity not npz": {"prior": None}}[what]
    b = _priors_bundle(tiny_self_bundle, copy_bundle, **kw)
    if what == "affinity not npz":               # an .npy where the CSR .npz should be
        m = _manifest(b)
        m["vocab"]["affinity"] = {"path": "vocab/index_map.npy"}
        _write_manifest(b, m)
    with pytest.raises(BundleError) as exc:
        Bundle.load(b)
    _one_line(exc)


# --------------------------------------------------------------------------- 5. stale export temp directories

def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    assert not WD.pid_alive(p.pid)
    return p.pid


def _fake_tmp(parent: Path, prefix: str, pid: int | None, age_s: float = 0, legacy: str = "k3_x9q2z") -> Path:
    """A temp dir as a killed export leaves it: owned by `pid`, or (pid None) a legacy unowned one."""
    name = f"{prefix}{pid}.{WD.host_tag()}-abcd1234" if pid is not None else f"{prefix}{legacy}"
    d = parent / name
    d.mkdir(parents=True)
    (d / "model.onnx.data").write_bytes(b"\0" * 1024)
    if age_s:
        t = time.time() - age_s
        for p in (d / "model.onnx.data", d):
            os.utime(p, (t, t))
    return d


def test_export_removes_stale_temp_dirs_only(tiny_models, tiny_export_cache, tmp_path):
    out = tmp_path / "b"
    dead = _dead_pid()
    stale = _fake_tmp(tmp_path, ".b.tmp-", dead)
    live = _fake_tmp(tmp_path, ".b.tmp-", os.getpid())
    legacy_old = _fake_tmp(tmp_path, ".b.tmp-", None, age_s=3 * 86400)        # no owner, untouched for days
    legacy_fresh = _fake_tmp(tmp_path, ".b.tmp-", None, legacy="fresh123")     # no owner, recent: may be live
    other_name = _fake_tmp(tmp_path, ".other.tmp-", dead)           # another bundle's: not ours to judge
    cache = tmp_path / "cache"
    cache.mkdir()
    for entry in tiny_export_cache.iterdir():                       # a private cache: the session's stays clean
        (cache / entry.name).symlink_to(entry)
    cache_stale = _fake_tmp(cache, "0123456789abcdef01234567.tmp-", dead)
    cache_live = _fake_tmp(cache, "0123456789abcdef01234567.tmp-", os.getpid())
    stale_log = cache / f".0123456789abcdef01234567.tmp-{dead}.{WD.host_tag()}-abcd1234.builder.log"
    stale_log.write_text("killed")
    BW.export_bundle(str(tiny_models["tiny-bl-a"]), str(tiny_models["tiny-bl-b"]), out, keep=100, progress=False,
                     cache=cache)
    Bundle.load(out)
    assert not stale.exists() and not legacy_old.exists() and not cache_stale.exists() and not stale_log.exists()
    assert live.exists() and legacy_fresh.exists() and other_name.exists() and cache_live.exists()
    assert all(e.exists() for e in tiny_export_cache.iterdir())
    # the new naming: a temp dir records its owner
    t = WD.owned_tmpdir(tmp_path, ".b.tmp-")
    assert t.name.startswith(f".b.tmp-{os.getpid()}.{WD.host_tag()}-") and not WD.is_stale(t, t.name[7:])
    t.rmdir()


def test_stale_old_bundle_dir_kept_while_out_is_missing(tmp_path):
    """`.OUT.old-*` is a replaced bundle: removed once OUT exists again, kept while it may be the only copy."""
    dead = _dead_pid()
    old = _fake_tmp(tmp_path, ".b.old-", dead)
    assert BW.remove_stale_leftovers(tmp_path / "b") == [] and old.exists()
    (tmp_path / "b").mkdir()
    assert BW.remove_stale_leftovers(tmp_path / "b") == [old] and not old.exists()


def test_pid_alive():
    assert WD.pid_alive(os.getpid()) and not WD.pid_alive(_dead_pid())
    assert not WD.pid_alive(0) and not WD.pid_alive(-5) and not WD.pid_alive(2**40)


# --------------------------------------------------------------------------- 6. calibrate --out into a new directory

def test_calibrate_out_creates_missing_directories(tmp_path, tiny_models, capsys):
    out = tmp_path / "new" / "deeper" / "vocab.json"
    rc = main(["calibrate", "--quiet", "--target", str(tiny_models["tiny-bl-a"]), "--drafter",
               str(tiny_models["tiny-bl-b"]), "--source", "raw", "--data", RAW, "--keep", "300", "--out", str(out)])
    assert rc == 0, capsys.readouterr().err
    assert json.loads(out.read_text())["format"] == "edgespec-vocab"
    assert (out.parent / "vocab.priors" / "prior.npy").is_file()


def test_calibrate_out_under_a_file(tmp_path, tiny_models, capsys):
    (tmp_path / "afile").write_text("x")
    rc = main(["calibrate", "--quiet", "--target", str(tiny_models["tiny-bl-a"]), "--drafter",
               str(tiny_models["tiny-bl-b"]), "--source", "raw", "--data", RAW, "--keep", "300",
               "--out", str(tmp_path / "afile" / "sub" / "vocab.json")])
    err = capsys.readouterr().err
    assert rc == 2 and "cannot create the directory" in err and len(err.strip().splitlines()) == 1, err
    from edgespec.calibrate.output import AtomicOutput
    with pytest.raises(CalibrationError, match="not a directory"):
        AtomicOutput(tmp_path / "afile" / "vocab.json")


def test_every_error_here_is_an_edgespec_error():
    assert issubclass(BundleError, EdgespecError) and issubclass(CalibrationError, EdgespecError)


def test_symlink_loop_and_unreadable_file(tiny_self_bundle, copy_bundle, monkeypatch):
    b = copy_bundle(tiny_self_bundle)
    (b / "vocab" / "a").symlink_to("b")
    (b / "vocab" / "b").symlink_to("a")
    with pytest.raises(BundleError, match="cannot be resolved") as exc:
        Bundle.load(b, verify="none")
    _one_line(exc)
    b2 = copy_bundle(tiny_self_bundle, "b2")

    def denied(path):
        raise PermissionError(13, "Permission denied", str(path))

    import edgespec.hashing as H
    monkeypatch.setattr(H, "sha256_file", denied)
    with pytest.raises(BundleError, match="cannot be read .Permission denied") as exc:
        Bundle.load(b2, verify="full")
    _one_line(exc)


def test_a_load_that_hashes_much_says_so_once(tmp_path, capsys, monkeypatch):
    """The first load of a bundle hashes its files and says so in one line where that reads more than
    NOTICE_BYTES; the next load reuses the digests and says nothing."""
    import edgespec.hashing as hashing
    from edgespec.hashing import DigestMemory

    monkeypatch.setattr(hashing, "NOTICE_BYTES", 1000)
    f = tmp_path / "weights.bin"
    f.write_bytes(b"x" * 5000)
    memory = DigestMemory(tmp_path / "digests.json")
    assert memory.say_if_slow([f], "bundle files") == 5000
    assert "checking 0.0 GB of bundle files (sha256)" in capsys.readouterr().err
    memory.sha256(f)
    assert memory.say_if_slow([f], "bundle files") == 0 and capsys.readouterr().err == ""
    monkeypatch.setattr(hashing, "NOTICE_BYTES", 10_000)
    assert DigestMemory(tmp_path / "other.json").say_if_slow([f]) == 5000 and capsys.readouterr().err == ""
