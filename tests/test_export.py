"""export/: ONNX export, head pruning, vocab files, bundle writer, CLI and its bad inputs."""
from __future__ import annotations

import errno
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from edgespec.cli import main
from edgespec.errors import ExportError, ModelSourceError
from edgespec.export import bundle_writer as BW
from edgespec.export import kept_vocab as KV
from edgespec.export import onnx_export as OX
from edgespec.export import graph_info as GI
from edgespec.export import prune as PR
from edgespec.runtime import Bundle
from edgespec.runtime.engine.kv import default_feeds
from edgespec.runtime.bundle.vocab import vocab_hash


def _ort_logits(path, ids, prefill=None):
    sess = OX.ort_session(path)
    return OX.run_prefill_decode(sess, ids, prefill or ids.shape[1] - 2), sess


def _torch_logits(hf_dir, ids):
    import torch
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32).eval()
    with torch.no_grad():
        return m(input_ids=torch.from_numpy(ids)).logits.numpy()


# ----------------------------------------------------------------------------- bundles and exactness

@pytest.mark.parametrize("name", ["same", "self", "hetero"])
def test_pruned_logits_exact(name, tiny_same_bundle, tiny_self_bundle, tiny_hetero_bundle, tiny_models):
    path = {"same": tiny_same_bundle, "self": tiny_self_bundle, "hetero": tiny_hetero_bundle}[name]
    b = Bundle.load(path)
    m = b.manifest
    assert m["checks"]["pruned_vs_full_max_abs_diff"] == 0.0
    assert m["checks"]["target_vs_torch_max_abs_diff"] <= 1e-3
    v_d = m["drafter"]["vocab_size"]
    ids = np.random.default_rng(7).integers(0, v_d, size=(1, 9))
    got, sess = _ort_logits(b.drafter.onnx, ids)
    assert got.shape == (1, 9, b.kept)
    # constant outputs
    outs = [o.name for o in sess.get_outputs()]
    assert outs[-2:] == ["index_map", "draft_ids"]
    # full drafter (torch) at kept columns
    d_dir = tiny_models[m["drafter"]["source"]["name"]]
    ref = _torch_logits(d_dir, ids)
    assert np.max(np.abs(got - ref[..., b.draft_ids])) <= 1e-4
    # target vs torch
    t_ids = np.random.default_rng(8).integers(0, m["target"]["vocab_size"], size=(1, 9))
    tgot, _ = _ort_logits(b.target.onnx, t_ids)
    tref = _torch_logits(tiny_models[m["target"]["source"]["name"]], t_ids)
    assert tgot.shape == tref.shape and np.max(np.abs(tgot - tref)) <= 1e-3


def test_constant_outputs_and_maps(tiny_hetero_bundle):
    b = Bundle.load(tiny_hetero_bundle)
    sess = OX.ort_session(b.drafter.onnx)
    feed = {"input_ids": np.array([[5]]), "attention_mask": np.ones((1, 1), np.int64)}
    if any(i.name == "position_ids" for i in sess.get_inputs()):   # optimum graphs; builder graphs derive them
        feed["position_ids"] = np.zeros((1, 1), np.int64)
    for i in sess.get_inputs():
        if i.name.startswith("past_key_values."):
            feed[i.name] = np.zeros([1, i.shape[1], 0, i.shape[3]], np.float32)
    index_map, draft_ids = sess.run(["index_map", "draft_ids"], {**feed, **default_feeds(sess)})
    assert index_map.dtype == np.int64 and np.array_equal(index_map, b.index_map)
    assert np.array_equal(draft_ids, b.draft_ids)
    assert np.array_equal(b.index_map, b.drafter_to_target[b.draft_ids])
    assert b.manifest["vocab"]["intersection"] == int((b.drafter_to_target >= 0).sum())
    assert -1 in b.index_map  # some SentencePiece tokens have no byte-level counterpart
    # specials kept; the byte-level target maps back
    sp_specials = b.manifest["drafter"]["tokenizer"]["num_special"]
    assert sp_specials >= 6 and set(range(6)) <= set(b.draft_ids.tolist())
    ok = b.target_to_drafter >= 0
    assert np.array_equal(b.drafter_to_target[b.target_to_drafter[ok]] >= 0, np.ones(ok.sum(), bool))


def test_manifest_contents(tiny_same_bundle):
    m = json.loads((tiny_same_bundle / "manifest.json").read_text())
    d, t = m["drafter"], m["target"]
    assert m["same_tokenizer"] is True and m["pair"] == "tiny-same"
    assert d["kept"] == m["vocab"]["kept"] and m["vocab"]["provenance"]["policy"] == "first-k"
    assert "first-K" in m["vocab"]["provenance"]["note"]
    hidden, v = d["hidden_size"], d["vocab_size"]
    # pruned head = K columns; bytes per forward drop by exactly (V-K) head rows
    assert d["bytes_per_forward_full"] - d["bytes_per_forward"] == (v - d["kept"]) * hidden * 4
    if d["head"]["head_shared_with_embedding"]:   # the table stays for the embedding Gather; the head is new
        assert d["params_pruned"] - d["params_full_graph"] == d["kept"] * hidden
    else:
        assert d["params_full_graph"] - d["params_pruned"] == (v - d["kept"]) * hidden
    # an embedding gather counts one row: bytes per forward < all weights
    assert t["bytes_per_forward"] < t["graph_params"] * 4
    for side in (t, d):
        assert side["source"]["sha256"] and side["io"]["inputs"][0] == "input_ids"
        assert side["tokenizer"]["vocab_hash"] and side["tokenizer"]["chat_template"] is True
    assert set(m["files"]) >= {"target/model.onnx", "drafter/model.onnx", "vocab/index_map.npy", "vocab/vocab.json"}


def test_first_k_keeps_specials():
    ids = KV.first_k(5, 100, specials=[98, 99, 0])
    assert ids.tolist() == [0, 1, 2, 98, 99]
    with pytest.raises(ExportError, match="special tokens"):
        KV.first_k(2, 100, specials=[97, 98, 99])


def test_prune_head_external_data(tiny_models, tmp_path):
    """The external-data path (what the 1.5B takes) on a tiny model, plus the tied MatMul(Transpose(E)) form."""
    import onnx
    from onnx import helper

    e = OX.export_model(tiny_models["tiny-bl-b"], "tied-ext", "tiny-bl-b", cache=tmp_path / "c", progress=False,
                        force_external=True)
    assert e.external_data and (e.dir / "model.onnx.data").is_file() and not (e.dir / "model.onnx_data").exists()
    # rewrite the head as MatMul(x, Transpose(E)) sharing the embedding, as optimum does with accelerate
    src = tmp_path / "tied"
    src.mkdir()
    shutil.copyfile(e.dir / "model.onnx.data", src / "model.onnx.data")
    m = onnx.load(str(e.onnx), load_external_data=False)
    mm, w, layout, _, _, _ = GI.find_head(m.graph)
    emb = next(t for t in m.graph.initializer if t.name == "model.embed_tokens.weight")
    assert layout == "HV"
    tp = helper.make_node("Transpose", [emb.name], ["emb_T"], perm=[1, 0], name="tiedT")
    m.graph.node.insert(0, tp)
    mm.input[1] = "emb_T"
    m.graph.initializer.remove(w)
    onnx.save_model(m, str(src / "model.onnx"))
    # the tiny-bl-b model is tied, so this graph computes the same logits
    ids = np.random.default_rng(3).integers(0, 600, size=(1, 6))
    full, _ = _ort_logits(src / "model.onnx", ids)
    ref, _ = _ort_logits(e.onnx, ids)
    assert np.max(np.abs(full - ref)) < 1e-5
    keep = np.array([0, 1, 2, 50, 77, 300, 599])
    info = PR.prune_head(src / "model.onnx", tmp_path / "out", keep, keep * 0 - 1)
    assert info["layout"] == "VH" and info["head_shared_with_embedding"] and info["external_data"]
    got, sess = _ort_logits(tmp_path / "out" / "model.onnx", ids)
    assert np.array_equal(got, full[..., keep])
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["model.onnx", "model.onnx.data"]
    stats = PR.weight_stats(tmp_path / "out" / "model.onnx")
    assert stats["params"] > 0


def test_force_external_bundle(tiny_models, tmp_path):
    out = BW.export_bundle(str(tiny_models["tiny-bl-a"]), str(tiny_models["tiny-bl-b"]), tmp_path / "b", keep=300,
                           progress=False, cache=tmp_path / "c", force_external=True)
    b = Bundle.load(out)
    assert b.manifest["target"]["external_data"] and b.manifest["drafter"]["external_data"]
    assert "target/model.onnx.data" in b.manifest["files"] and "drafter/model.onnx.data" in b.manifest["files"]
    assert b.manifest["checks"]["pruned_vs_full_max_abs_diff"] == 0.0


def test_reexport_reuses_cache_and_replaces_bundle(tiny_models, tiny_export_cache, tmp_path, monkeypatch):
    out = tmp_path / "b"
    BW.export_bundle(str(tiny_models["tiny-bl-a"]), str(tiny_models["tiny-bl-b"]), out, keep=200, progress=False,
                     cache=tiny_export_cache)

    def boom(*a, **k):
        raise AssertionError("cached export not reused")

    monkeypatch.setattr(OX, "_export_into", boom)
    BW.export_bundle(str(tiny_models["tiny-bl-a"]), str(tiny_models["tiny-bl-b"]), out, keep=100, progress=False,
                     cache=tiny_export_cache)
    assert Bundle.load(out).kept == 100  # an existing bundle is replaced
    assert [p.name for p in tmp_path.iterdir()] == ["b"]  # no temporary leftovers


# ----------------------------------------------------------------------------- vocab files and priors

def _vocab_doc(tok_dir, ids, priors_dir=None):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(Path(tok_dir) / "tokenizer.json"))
    return {"format": "edgespec-vocab", "format_version": 1,
            "tokenizer": {"vocab_hash": vocab_hash(tok), "vocab_size": tok.get_vocab_size()},
            "kept_ids": ids, "provenance": {"policy": "keep", "source": "raw", "corpus": "test"},
            "priors_dir": priors_dir}


def test_vocab_file_with_priors(tiny_models, tiny_export_cache, tmp_path):
    sp = tiny_models["tiny-sp"]
    ids = sorted(np.random.default_rng(0).choice(np.arange(10, 500), size=150, replace=False).tolist())
    pdir = tmp_path / "vocab.priors"
    pdir.mkdir()
    v_t = json.loads((tiny_models["tiny-bl-a"] / "config.json").read_text())["vocab_size"]
    prior = np.full(v_t, 1.0 / v_t, np.float32)
    np.save(pdir / "prior.npy", prior)
    np.savez(pdir / "affinity.npz", data=np.array([0.5, 0.5], np.float32), indices=np.array([3, 4], np.int32),
             indptr=np.r_[np.zeros(1), np.full(150, 2)].astype(np.int64), shape=np.array([150, v_t], np.int64))
    (pdir / "randomised.json").write_text(json.dumps({"a_star": 0.8, "lambda": 0.3}))
    (tmp_path / "vocab.json").write_text(json.dumps(_vocab_doc(sp, ids, "vocab.priors")))
    out = BW.export_bundle(str(tiny_models["tiny-bl-a"]), str(sp), tmp_path / "b", vocab=tmp_path / "vocab.json",
                           progress=False, cache=tiny_export_cache)
    b = Bundle.load(out)
    assert set(ids) <= set(b.draft_ids.tolist()) and set(range(6)) <= set(b.draft_ids.tolist())  # + specials
    assert b.kept == len(ids) + 6
    assert b.manifest["vocab"]["provenance"]["policy"] == "keep"
    assert b.prior is not None and np.allclose(b.prior, prior)
    assert b.affinity is not None and b.affinity.shape == (150, v_t)
    assert b.a_star == 0.8 and b.manifest["vocab"]["randomised"]["lambda"] == 0.3
    assert b.manifest["checks"]["pruned_vs_full_max_abs_diff"] == 0.0


# ----------------------------------------------------------------------------- bad input (CLI: one line, exit 2, nothing written)

def _cli(argv, capsys):
    """Run the CLI; return (exit code, the one `edgespec: error:` line) (progress output is ignored)."""
    rc = main(argv)
    err = capsys.readouterr().err.replace("\r", "\n")
    lines = [ln for ln in err.splitlines() if ln.startswith("edgespec: error:")]
    assert len(lines) <= 1, err
    return rc, (lines[0] if lines else "")


@pytest.fixture
def iso_home(tmp_path, monkeypatch):
    home = tmp_path / "home"
    monkeypatch.setenv("EDGESPEC_HOME", str(home))
    return home


def _no_partial(parent: Path, name: str = "out"):
    assert not (parent / name).exists()
    assert not [p for p in parent.iterdir() if p.name.startswith(f".{name}.tmp-")]


def test_bad_unknown_recipe(capsys, tmp_path, iso_home):
    rc, err = _cli(["export", "--pair", "no-such-pair", "--out", str(tmp_path / "out")], capsys)
    assert rc == 2 and err.startswith("edgespec: error: unknown pair recipe 'no-such-pair'") and "\n" not in err
    rc, err = _cli(["export", "--target", "no-such-model", "--drafter", "no-such-model", "--keep", "8",
                    "--out", str(tmp_path / "out")], capsys)
    assert rc == 2 and "unknown model source 'no-such-model'" in err and "\n" not in err
    rc, err = _cli(["models", "pull", "no-such-model"], capsys)
    assert rc == 2 and "unknown recipe 'no-such-model'" in err
    _no_partial(tmp_path)


def _fake_recipe(tmp_path, monkeypatch, chunks: list[bytes], sha: str):
    """A recipe whose weights are files of a fake package `fakeweights` on sys.path."""
    pkg = tmp_path / "site" / "fakeweights"
    (pkg / "data").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    files = []
    for i, c in enumerate(chunks):
        (pkg / "data" / f"part{i}.bin").write_bytes(c)
        files.append(f"fakeweights:data/part{i}.bin")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    import edgespec.models as M

    real = M._toml_files

    def fake():
        d = dict(real())
        d["fake-model"] = {"name": "fake-model", "arch": "llama", "weights": {
            "packages": ["fakeweights==0"], "files": files, "gguf_name": "fake.gguf", "sha256": sha}}
        return d

    monkeypatch.setattr(M, "_toml_files", fake)


@pytest.mark.parametrize("nchunks", [1, 3])
def test_bad_sha256_mismatch(tmp_path, monkeypatch, capsys, iso_home, nchunks):
    _fake_recipe(tmp_path, monkeypatch, [b"GGUF not really %d" % i for i in range(nchunks)], "0" * 64)
    rc, err = _cli(["models", "pull", "fake-model", "--quiet"], capsys)
    assert rc == 2 and "sha256 mismatch for fake-model" in err and "refusing" in err and "\n" not in err
    assert not (iso_home / "models" / "fake-model").exists()
    assert not list((iso_home / "gguf").glob("*")) if (iso_home / "gguf").exists() else True
    rc, err = _cli(["export", "--target", "fake-model", "--drafter", "fake-model", "--keep", "8",
                    "--out", str(tmp_path / "out")], capsys)
    assert rc == 2 and "sha256 mismatch" in err
    _no_partial(tmp_path)


def test_bad_unreadable_gguf(tmp_path, capsys, iso_home):
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF" + b"\x03\x00\x00\x00" + b"\xff" * 200)
    rc, err = _cli(["export", "--target", str(bad), "--drafter", str(bad), "--keep", "8", "--out", str(tmp_path / "out")],
                   capsys)
    assert rc == 2 and "cannot read GGUF" in err and "\n" not in err
    _no_partial(tmp_path)
    assert not [p for p in (iso_home / "models").iterdir()] if (iso_home / "models").exists() else True


@pytest.mark.parametrize("keep,msg", [("0", "positive"), ("-3", "positive"), ("100000", "larger than the drafter vocabulary")])
def test_bad_keep(tiny_models, tmp_path, capsys, iso_home, keep, msg):
    rc, err = _cli(["export", "--target", str(tiny_models["tiny-bl-a"]), "--drafter", str(tiny_models["tiny-sp"]),
                    "--keep", keep, "--out", str(tmp_path / "out")], capsys)
    assert rc == 2 and msg in err and "\n" not in err
    _no_partial(tmp_path)
    assert not (iso_home / "onnx").exists()  # refused before any export work


def test_bad_vocab_for_other_tokenizer(tiny_models, tmp_path, capsys, iso_home):
    # a vocab made for the byte-level tokenizer, used with the SentencePiece drafter
    (tmp_path / "vocab.json").write_text(json.dumps(_vocab_doc(tiny_models["tiny-bl-a"], list(range(100)))))
    rc, err = _cli(["export", "--target", str(tiny_models["tiny-bl-a"]), "--drafter", str(tiny_models["tiny-sp"]),
                    "--vocab", str(tmp_path / "vocab.json"), "--out", str(tmp_path / "out")], capsys)
    assert rc == 2 and "made for another tokenizer" in err and "\n" not in err
    _no_partial(tmp_path)


def test_bad_vocab_file_contents(tiny_models, tmp_path):
    sp = tiny_models["tiny-sp"]
    h = vocab_hash(sp)
    with pytest.raises(ExportError, match="not valid JSON"):
        (tmp_path / "v.json").write_text("{")
        KV.load_vocab_file(tmp_path / "v.json", h, 512, [])
    with pytest.raises(ExportError, match="not an edgespec vocab file"):
        (tmp_path / "v.json").write_text("{}")
        KV.load_vocab_file(tmp_path / "v.json", h, 512, [])
    with pytest.raises(ExportError, match="outside the drafter vocabulary"):
        (tmp_path / "v.json").write_text(json.dumps(_vocab_doc(sp, [1, 2, 9999])))
        KV.load_vocab_file(tmp_path / "v.json", h, 512, [])


def test_bad_existing_non_bundle_out(tiny_models, tmp_path, capsys, iso_home):
    out = tmp_path / "out"
    out.mkdir()
    (out / "precious.txt").write_text("keep me")
    rc, err = _cli(["export", "--target", str(tiny_models["tiny-bl-a"]), "--drafter", str(tiny_models["tiny-sp"]),
                    "--keep", "100", "--out", str(out)], capsys)
    assert rc == 2 and "exists and is not an edgespec bundle" in err
    assert (out / "precious.txt").read_text() == "keep me" and len(list(out.iterdir())) == 1


def test_bad_no_disk_space_up_front(tiny_models, tmp_path, capsys, iso_home, monkeypatch):
    """The up-front free-space check (the free-space probe is replaced: no real disk is filled)."""
    monkeypatch.setattr(BW, "free_bytes", lambda path: 1000)
    rc, err = _cli(["export", "--target", str(tiny_models["tiny-bl-a"]), "--drafter", str(tiny_models["tiny-sp"]),
                    "--keep", "100", "--out", str(tmp_path / "out")], capsys)
    assert rc == 2 and "not enough disk space" in err and "\n" not in err
    _no_partial(tmp_path)


def test_bad_enospc_during_write(tiny_models, tiny_export_cache, tmp_path, monkeypatch):
    """A write failing with ENOSPC mid-bundle: clear error, temporary directory removed, no bundle."""
    def full_disk(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "x"))

    monkeypatch.setattr(PR, "prune_head", full_disk)
    with pytest.raises(ExportError, match="no space left on device"):
        BW.export_bundle(str(tiny_models["tiny-bl-a"]), str(tiny_models["tiny-sp"]), tmp_path / "out", keep=100,
                         progress=False, cache=tiny_export_cache)
    _no_partial(tmp_path)


def test_interrupt_leaves_no_partial_bundle(tiny_models, tiny_export_cache, tmp_path, monkeypatch):
    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(PR, "prune_head", interrupted)
    with pytest.raises(KeyboardInterrupt):
        BW.export_bundle(str(tiny_models["tiny-bl-a"]), str(tiny_models["tiny-sp"]), tmp_path / "out", keep=100,
                         progress=False, cache=tiny_export_cache)
    _no_partial(tmp_path)


def test_interrupt_keeps_previous_bundle(tiny_same_bundle, tiny_models, tiny_export_cache, tmp_path, monkeypatch):
    out = tmp_path / "out"
    shutil.copytree(tiny_same_bundle, out)
    before = (out / "manifest.json").read_text()
    monkeypatch.setattr(PR, "prune_head", lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):
        BW.export_bundle(str(tiny_models["tiny-bl-a"]), str(tiny_models["tiny-sp"]), out, keep=100, progress=False,
                         cache=tiny_export_cache)
    assert (out / "manifest.json").read_text() == before
    Bundle.load(out)


def test_bad_hub_id_without_network(tmp_path, capsys, iso_home, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # an empty hub cache
    rc, err = _cli(["export", "--target", "some-org/some-model", "--drafter", "some-org/some-model", "--keep", "8",
                    "--out", str(tmp_path / "out")], capsys)
    assert rc == 2 and "\n" not in err
    assert "not reachable" in err or "not found on the model hub" in err
    _no_partial(tmp_path)


def test_keep_and_vocab_exclusive(capsys):
    with pytest.raises(SystemExit):
        main(["export", "--pair", "smollm-self", "--keep", "8", "--vocab", "v.json"])


# ----------------------------------------------------------------------------- models CLI

def test_models_list(capsys, iso_home):
    assert main(["models", "list"]) == 0
    out = capsys.readouterr().out
    for name in ("smollm2-135m", "gemma3-270m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b", "qwen-coder",
                 "qwen-smollm", "qwen-gemma", "smollm-self"):
        assert name in out
    assert main(["models", "list", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert {p["name"] for p in data["pairs"]} == {"qwen-coder", "qwen-smollm", "qwen-gemma", "smollm-self"}
    assert all(m["cached"] is False for m in data["models"])  # an empty EDGESPEC_HOME


# ----------------------------------------------------------------------------- real weights (CI: SmolLM2 from pip)

@pytest.mark.real
def test_real_smollm_self_bundle(smollm_self_bundle):
    b = Bundle.load(smollm_self_bundle, verify="full")
    m = b.manifest
    assert m["pair"] == "smollm-self" and b.kept == 8192 and m["same_tokenizer"]
    assert m["checks"]["pruned_vs_full_max_abs_diff"] <= 1e-4
    assert m["checks"]["target_vs_torch"]["ok"] and m["checks"]["target_vs_torch_max_abs_diff"] <= 1e-3
    assert np.array_equal(b.draft_ids, np.arange(8192)) and np.array_equal(b.index_map, np.arange(8192))
    ids = np.array([[1, 504, 3458, 314, 253, 1345, 28, 9533, 30, 216]], dtype=np.int64)  # ordinary SmolLM2 ids
    got, sess = _ort_logits(b.drafter.onnx, ids, prefill=8)
    assert got.shape == (1, 10, 8192)
    feed = {"input_ids": ids[:, :1], "attention_mask": np.ones((1, 1), np.int64)}
    if any(i.name == "position_ids" for i in sess.get_inputs()):
        feed["position_ids"] = np.zeros((1, 1), np.int64)
    for i in sess.get_inputs():
        if i.name.startswith("past_key_values."):
            feed[i.name] = np.zeros([1, i.shape[1], 0, i.shape[3]], np.float32)
    index_map, draft_ids = sess.run(["index_map", "draft_ids"], {**feed, **default_feeds(sess)})
    assert index_map.shape == (8192,) and np.array_equal(draft_ids, np.arange(8192))
    del sess
    full, _ = _ort_logits(b.target.onnx, ids, prefill=8)  # the target is the unpruned SmolLM2
    assert np.array_equal(got, full[..., :8192])
    from edgespec.models.weights import cached_dir

    ref = _torch_logits(cached_dir("smollm2-135m"), ids)
    assert np.max(np.abs(full - ref)) <= 1e-3


def test_vocab_priors_digest_mismatch(tiny_models, tiny_export_cache, tmp_path):
    sp = tiny_models["tiny-sp"]
    pdir = tmp_path / "v.priors"
    pdir.mkdir()
    np.save(pdir / "prior.npy", np.ones(608, np.float32) / 608)
    doc = _vocab_doc(sp, list(range(50)), "v.priors")
    doc["provenance"]["priors_files"] = {"prior.npy": "0" * 64}
    (tmp_path / "v.json").write_text(json.dumps(doc))
    with pytest.raises(ExportError, match="does not match the vocab file"):
        BW.export_bundle(str(tiny_models["tiny-bl-a"]), str(sp), tmp_path / "out", vocab=tmp_path / "v.json",
                         progress=False, cache=tiny_export_cache)
    _no_partial(tmp_path)


@pytest.mark.real
def test_real_models_pull_pair_uses_cache(capsys):
    """`edgespec models pull PAIR` pulls both models (SmolLM2 twice here: once)."""
    assert main(["models", "pull", "smollm-self", "--quiet"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and out[0].startswith("smollm2-135m: ")
