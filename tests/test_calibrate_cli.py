"""`edgespec calibrate` end to end on the tiny models/bundles: outputs, priors, export, determinism, bad input."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from edgespec.cli import main

RAW = str(Path(__file__).resolve().parent / "tinymodels.py")


def _run(*args, capsys=None) -> tuple[int, str]:
    rc = main(["calibrate", "--quiet", *map(str, args)])
    err = capsys.readouterr().err if capsys is not None else ""
    return rc, err


def _outputs(out: Path) -> dict:
    stem = out.name[:-5]
    return {"vocab": out, "priors": out.parent / f"{stem}.priors", "curve": out.parent / f"{stem}.coverage.json",
            "png": out.parent / f"{stem}.coverage.png"}


def test_raw_source_writes_vocab_priors_and_curve(tmp_path, tiny_models):
    from edgespec.calibrate.select import always_kept, coverage_of
    from edgespec.export.kept_vocab import load_vocab_file
    from edgespec.runtime.bundle.vocab import tokenizer_info

    a, b = tiny_models["tiny-bl-a"], tiny_models["tiny-bl-b"]
    out = tmp_path / "raw.json"
    heldout = tmp_path / "held.txt"
    heldout.write_text("def quicksort(items):\n    return sorted(items)\n")
    rc, _ = _run("--target", a, "--drafter", b, "--source", "raw", "--data", RAW, "--keep", 300,
                 "--heldout", heldout, "--out", out)
    assert rc == 0
    o = _outputs(out)
    doc = json.loads(out.read_text())
    kept = doc["kept_ids"]
    assert len(kept) == 300 and kept == sorted(set(kept))
    assert set(always_kept(b)) <= set(kept)
    with np.load(o["priors"] / "counts.npz", allow_pickle=False) as z:
        counts = z["drafter"]
    assert doc["provenance"]["coverage"] == pytest.approx(coverage_of(counts, kept))
    assert doc["provenance"]["tokens_counted"] == int(counts.sum())
    prior = np.load(o["priors"] / "prior.npy", allow_pickle=False)
    assert prior.dtype == np.float32 and abs(float(prior.sum(dtype=np.float64)) - 1) < 1e-6
    curve = json.loads(o["curve"].read_text())
    assert curve["k"][-1] == doc["tokenizer"]["vocab_size"] and curve["coverage"][-1] == pytest.approx(1.0)
    assert 0 < curve["heldout_kept"] <= 1 and len(curve["heldout"]["held.txt"]) == len(curve["k"])
    assert o["png"].read_bytes()[:4] == b"\x89PNG"
    prov = doc["provenance"]
    assert "--keep 300" in prov["command"] and prov["inputs"]["target"]["sha256"]
    assert prov["sources"]["raw"]["files_sha256"] and "numpy" in prov["versions"]
    # the export side accepts it
    info = tokenizer_info(b)
    kv = load_vocab_file(out, info.vocab_hash, doc["tokenizer"]["vocab_size"], info.special_ids)
    assert kv.ids.tolist() == kept
    assert not list(tmp_path.glob(".*tmp*"))


def test_generated_sources_through_a_bundle_are_deterministic(tmp_path, tiny_same_bundle):
    from edgespec.runtime.samplers.rdk import Affinity

    def once(name):
        out = tmp_path / name / "v.json"
        out.parent.mkdir()
        rc, _ = _run("--bundle", tiny_same_bundle, "--source", "target", "drafter", "--mix", 2, 1,
                     "--prompts", "humaneval", "--max-tokens", 60, "--max-new-tokens", 20, "--keep", 200,
                     "--affinity", "cooc", "--affinity-topk", 8, "--a-star", "--lambda", 0.4,
                     "--tf-positions", 60, "--seed", 3, "--save-text", out.parent / "gen.jsonl", "--out", out)
        assert rc == 0
        return out

    o1, o2 = _outputs(once("a")), _outputs(once("b"))
    d1, d2 = (json.loads(o["vocab"].read_text()) for o in (o1, o2))
    for d in (d1, d2):
        d["provenance"].pop("command")
        d["provenance"]["inputs"]["bundle"].pop("path", None)
    assert d1 == d2
    for name in ("prior.npy", "counts.npz", "affinity.npz", "randomised.json", "affinity.json"):
        assert (o1["priors"] / name).read_bytes() == (o2["priors"] / name).read_bytes(), name
    src = d1["provenance"]["sources"]
    assert src["target"]["engine"] == "BundleGenerator" and 0 < src["target"]["tokens"] <= 60
    assert d1["provenance"]["mix"] == {"target": pytest.approx(2 / 3), "drafter": pytest.approx(1 / 3)}
    m = Affinity.load(o1["priors"] / "affinity.npz")
    assert m.shape == (200, json.loads((tiny_same_bundle / "manifest.json").read_text())["target"]["vocab_size"])
    assert np.diff(m.indptr).max() <= 8
    rnd = json.loads((o1["priors"] / "randomised.json").read_text())
    assert 0.0 <= rnd["a_star"] <= 1.0 and rnd["lambda"] == 0.4 and rnd["positions"] > 0
    gen = [json.loads(line) for line in (tmp_path / "a" / "gen.jsonl").read_text().splitlines()]
    assert {g["source"] for g in gen} == {"target", "drafter"} and all(g["token_ids"] for g in gen)


def test_heterogeneous_pair_maps_counts_and_aligns_positions(tmp_path, tiny_hetero_bundle):
    from edgespec.runtime.samplers.rdk import Affinity

    import tinymodels

    out = tmp_path / "h.json"
    data = tmp_path / "text.txt"
    data.write_text((tinymodels.ENGLISH + tinymodels.CODE) * 3)
    rc, _ = _run("--bundle", tiny_hetero_bundle, "--source", "target", "raw", "--data", data,
                 "--prompts", "humaneval", "--max-tokens", 60, "--max-new-tokens", 30, "--coverage", 0.9,
                 "--affinity", "cov", "--tf-positions", 400, "--out", out)
    assert rc == 0
    doc = json.loads(out.read_text())
    mapped = doc["provenance"]["sources"]["target"]["mapped"]
    assert mapped["direct"] + mapped["retokenised"] + mapped["unmapped"] == doc["provenance"]["sources"]["target"]["tokens"]
    assert doc["provenance"]["coverage"] >= 0.9 and not doc["provenance"]["same_tokenizer"]
    man = json.loads((tiny_hetero_bundle / "manifest.json").read_text())
    m = Affinity.load(_outputs(out)["priors"] / "affinity.npz")
    assert m.shape == (len(doc["kept_ids"]), man["target"]["vocab_size"])
    info = json.loads((_outputs(out)["priors"] / "affinity.json").read_text())
    assert info["positions"] > 20 and info["estimator"] == "cov"
    check = info["heldout_check"]
    assert check["positions"] > 0 and 0 < check["acceptance_tli"] <= 1
    assert set(check["acceptance_rdk_by_identity_weight"]) == {"0.0", "0.5", "0.8", "0.9", "0.95", "0.98", "0.99", "1.0"}
    assert check["acceptance_rdk"] == max(check["acceptance_rdk_by_identity_weight"].values())
    assert info["identity_weight"] in (0.0, 0.5, 0.8, 0.9, 0.95, 0.98, 0.99, 1.0)
    assert check["acceptance_rdk_by_identity_weight"]["1.0"] == pytest.approx(check["acceptance_tli"])  # M = I is TLI


def test_export_carries_the_priors_into_the_bundle(tmp_path, tiny_models, tiny_export_cache):
    from edgespec.export.bundle_writer import export_bundle
    from edgespec.runtime import Bundle, SpeculativeDecoder

    a, b = tiny_models["tiny-bl-a"], tiny_models["tiny-bl-b"]
    out = tmp_path / "v.json"
    rc, _ = _run("--target", a, "--drafter", b, "--source", "raw", "--data", RAW, "--keep", 320,
                 "--affinity", "cooc", "--a-star", "--lambda", 0.5, "--tf-positions", 64, "--out", out)
    assert rc == 0
    bundle = export_bundle(str(a), str(b), tmp_path / "bundle", vocab=out, progress=False, cache=tiny_export_cache)
    bd = Bundle.load(bundle)
    assert bd.kept == 320 and bd.prior is not None and abs(float(bd.prior.sum(dtype=np.float64)) - 1) < 1e-6
    assert bd.affinity is not None and bd.affinity.shape == (320, bd.target.vocab_size)
    assert bd.affinity_info["estimator"] == "cooc"
    assert 0.0 <= bd.a_star <= 1.0 and bd.randomised["lambda"] == 0.5
    dec = SpeculativeDecoder(bd, strategy="rdk", threads=1)       # the calibrated prior and M at work
    ar = dec.variant("ar").generate("def f(x):", max_new_tokens=8).token_ids
    for strategy in ("rdk", "rdk-taylor", "tli"):
        res = dec.variant(strategy).generate("def f(x):", max_new_tokens=8)
        assert res.token_ids == ar and res.stats.drafted > 0, strategy


@pytest.mark.parametrize("case,match", [
    ("glob", "matches no files"),
    ("empty", "empty corpus"),
    ("keep0", "--keep must be at least 1"),
    ("keepbig", "out of range"),
    ("cov", r"--coverage must be in \(0, 1\]"),
    ("mix", "weight"),
    ("noprompts", "needs --prompts"),
    ("nomodels", "name the models"),
])
def test_bad_input_is_a_clear_error_and_writes_nothing(tmp_path, tiny_models, capsys, case, match):
    a, b = tiny_models["tiny-bl-a"], tiny_models["tiny-bl-b"]
    (tmp_path / "empty.txt").write_text("")
    models = ["--target", a, "--drafter", b]
    args = {
        "glob": [*models, "--source", "raw", "--data", tmp_path / "*.none", "--keep", 10],
        "empty": [*models, "--source", "raw", "--data", tmp_path / "empty.txt", "--keep", 10],
        "keep0": [*models, "--source", "raw", "--data", RAW, "--keep", 0],
        "keepbig": [*models, "--source", "raw", "--data", RAW, "--keep", 10**6],
        "cov": [*models, "--source", "raw", "--data", RAW, "--coverage", 1.5],
        "mix": [*models, "--source", "raw", "--data", RAW, "--mix", 1, 2, "--keep", 10],
        "noprompts": [*models, "--source", "target", "--keep", 10],
        "nomodels": ["--source", "raw", "--data", RAW, "--keep", 10],
    }[case]
    out = tmp_path / "v.json"
    rc, err = _run(*args, "--out", out, capsys=capsys)
    assert rc == 2 and "edgespec: error:" in err and __import__("re").search(match, err), err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty.txt"]


def test_binary_files_in_the_corpus_are_skipped(tmp_path, tiny_models, capsys):
    a = tiny_models["tiny-bl-a"]
    data = tmp_path / "data"
    data.mkdir()
    (data / "code.py").write_text(Path(RAW).read_text())
    (data / "blob.bin").write_bytes(bytes(range(256)) * 8)
    (data / "latin.txt").write_bytes(b"na\xefve\n")
    rc, err = _run("--target", a, "--drafter", a, "--source", "raw", "--data", data, "--keep", 100,
                   "--out", tmp_path / "v.json", capsys=capsys)
    assert rc == 0 and "skipped 2 file(s)" in err
    raw = json.loads((tmp_path / "v.json").read_text())["provenance"]["sources"]["raw"]
    assert (raw["files"], raw["skipped_binary"], raw["skipped_not_utf8"]) == (1, 1, 1)


@pytest.mark.parametrize("where", ["edgespec.calibrate.priors.unigram_prior", "edgespec.calibrate.select.plot_curve"])
def test_interrupted_calibration_leaves_no_partial_output(tmp_path, tiny_models, monkeypatch, where):
    import importlib

    module, name = where.rsplit(".", 1)

    def boom(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(importlib.import_module(module), name, boom)
    a = tiny_models["tiny-bl-a"]
    out = tmp_path / "v.json"
    rc = main(["calibrate", "--quiet", "--target", str(a), "--drafter", str(a), "--source", "raw", "--data", RAW,
               "--keep", "100", "--out", str(out)])
    assert rc == 130
    assert list(tmp_path.iterdir()) == []


def test_vocab_for_another_tokenizer_is_refused_by_export(tmp_path, tiny_models, tiny_export_cache):
    from edgespec.errors import ExportError
    from edgespec.export.bundle_writer import export_bundle

    a, sp = tiny_models["tiny-bl-a"], tiny_models["tiny-sp"]
    out = tmp_path / "sp.json"
    rc, _ = _run("--target", a, "--drafter", sp, "--source", "raw", "--data", RAW, "--keep", 300, "--out", out)
    assert rc == 0
    with pytest.raises(ExportError, match="another tokenizer"):
        export_bundle(str(a), str(tiny_models["tiny-bl-b"]), tmp_path / "b", vocab=out, progress=False,
                      cache=tiny_export_cache)


@pytest.mark.parametrize("engine", ["bundle", "torch"])
def test_lambda_is_measured_when_not_given(tmp_path, tiny_models, tiny_self_bundle, engine):
    a = tiny_models["tiny-bl-a"]
    models = ["--bundle", tiny_self_bundle] if engine == "bundle" else ["--target", a, "--drafter", a]
    out = tmp_path / "v.json"
    rc, _ = _run(*models, "--source", "raw", "--data", RAW, "--keep", 300, "--a-star", "--tf-positions", 32,
                 "--out", out)
    assert rc == 0
    rnd = json.loads((tmp_path / "v.priors" / "randomised.json").read_text())
    assert 0.05 < rnd["lambda"] < 5 and rnd["lambda_source"] == ("onnx cpu" if engine == "bundle"
                                                                  else "torch cpu (full drafter head)")
    assert rnd["positions"] == 32 and not (tmp_path / "v.priors" / "affinity.npz").exists()


def test_a_bundle_serves_the_self_pair_without_torch(tmp_path, tiny_self_bundle):
    import subprocess
    import sys

    code = ("import sys; from edgespec.cli import main; "
            f"rc = main(['calibrate', '--quiet', '--bundle', {str(tiny_self_bundle)!r}, '--source', 'target', 'drafter', "
            f"'--prompts', 'humaneval', '--max-tokens', '30', '--keep', '300', '--affinity', 'cooc', '--a-star', "
            f"'--tf-positions', '32', '--out', {str(tmp_path / 'v.json')!r}]); "
            "print(rc, 'torch' in sys.modules, 'transformers' in sys.modules)")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env={**__import__("os").environ, "OMP_NUM_THREADS": "1"})
    assert res.stdout.strip().splitlines()[-1] == "0 False False", res.stderr[-2000:]


def test_vocab_reuse_computes_priors_for_an_existing_kept_set(tmp_path, tiny_models, capsys):
    a, b, sp = tiny_models["tiny-bl-a"], tiny_models["tiny-bl-b"], tiny_models["tiny-sp"]
    first = tmp_path / "first.json"
    assert _run("--target", a, "--drafter", b, "--source", "raw", "--data", RAW, "--coverage", 0.8,
                "--out", first)[0] == 0
    again = tmp_path / "again.json"
    rc, _ = _run("--target", a, "--drafter", b, "--source", "raw", "--data", RAW, "--vocab", first,
                 "--affinity", "cooc", "--tf-positions", 32, "--out", again)
    assert rc == 0
    d1, d2 = json.loads(first.read_text()), json.loads(again.read_text())
    assert d2["kept_ids"] == d1["kept_ids"] and d2["provenance"]["policy"] == "coverage"
    assert d2["provenance"]["kept_from"]["vocab"] == str(first)
    assert (tmp_path / "again.priors" / "affinity.npz").is_file()
    # a vocab made for another drafter tokenizer is refused
    rc, err = _run("--target", a, "--drafter", sp, "--source", "raw", "--data", RAW, "--vocab", first,
                   "--out", tmp_path / "x.json", capsys=capsys)
    assert rc == 2 and "another tokenizer" in err and not (tmp_path / "x.json").exists()


def test_saved_generations_are_reused(tmp_path, tiny_same_bundle, tiny_hetero_bundle, capsys):
    gen = tmp_path / "gen.jsonl"
    assert _run("--bundle", tiny_same_bundle, "--source", "target", "--prompts", "humaneval", "--max-tokens", 50,
                "--keep", 200, "--save-text", gen, "--out", tmp_path / "first.json")[0] == 0
    recs = [json.loads(line) for line in gen.read_text().splitlines()]
    assert all({"prompt_text", "prompt_ids", "token_ids", "vocab_hash"} <= set(r) for r in recs)
    out = tmp_path / "mix.json"
    rc, _ = _run("--bundle", tiny_same_bundle, "--source", "raw", "target", "--data", RAW, "--generated", gen,
                 "--keep", 200, "--affinity", "cooc", "--tf-positions", 40, "--out", out)
    assert rc == 0
    first = json.loads((tmp_path / "first.json").read_text())["provenance"]["sources"]["target"]
    tgt = json.loads(out.read_text())["provenance"]["sources"]["target"]
    assert tgt["tokens"] == first["tokens"] == sum(len(r["token_ids"]) for r in recs)
    assert tgt["engine"] == "saved generations (--generated)"
    # generations of another target tokenizer are refused
    sp_gen = tmp_path / "sp.jsonl"
    sp_gen.write_text("".join(json.dumps({**r, "vocab_hash": "0" * 64}) + "\n" for r in recs))
    rc, err = _run("--bundle", tiny_hetero_bundle, "--source", "target", "--generated", sp_gen, "--keep", 200,
                   "--out", tmp_path / "x.json", capsys=capsys)
    assert rc == 2 and "another target tokenizer" in err


def test_saved_generations_bad_lines(tmp_path):
    """--generated files: blank lines pass, a line that is not JSON or not a record names its file and line."""
    from edgespec.calibrate.generate import load_generations
    from edgespec.errors import CalibrationError

    rec = {"source": "target", "id": "p0", "prompt_text": "a", "prompt_ids": [1], "text": "b", "token_ids": [2, 3],
           "vocab_hash": "h"}
    good = tmp_path / "good.jsonl"
    good.write_text("\n" + json.dumps(rec) + "\n\n" + json.dumps({**rec, "source": "drafter"}) + "\n")
    (g,) = load_generations([good], "target", "h")
    assert g.prompt_id == "p0" and g.ids.tolist() == [2, 3]
    for name, line, msg in [("bad.jsonl", "{not json", r"bad.jsonl:2: not valid JSON"),
                            ("rec.jsonl", json.dumps({"source": "target"}), r"rec.jsonl:2: not a generation record")]:
        (tmp_path / name).write_text(json.dumps(rec) + "\n" + line + "\n")
        with pytest.raises(CalibrationError, match=msg):
            load_generations([tmp_path / name], "target", "h")


@pytest.fixture(scope="module")
def target_only_bundle(tiny_models, tiny_export_cache, tmp_path_factory):
    from edgespec.export.bundle_writer import export_bundle

    out = tmp_path_factory.mktemp("target-only") / "b"
    export_bundle(str(tiny_models["tiny-bl-a"]), None, out, progress=False, cache=tiny_export_cache)
    return out


def test_target_bundle_generates_the_target_text_without_torch(tmp_path, tiny_models, target_only_bundle):
    """`--target-bundle`: the target's completions come from a target-only bundle's ONNX graph (no torch
    loaded), the drafter's tokenizer from --drafter; the kept set is the drafter's and export takes it."""
    import subprocess
    import sys

    out = tmp_path / "v.json"
    code = ("import sys; from edgespec.cli import main; "
            f"rc = main(['calibrate', '--quiet', '--target', {str(tiny_models['tiny-bl-a'])!r}, '--drafter', "
            f"{str(tiny_models['tiny-bl-b'])!r}, '--target-bundle', {str(target_only_bundle)!r}, '--source', 'target', "
            f"'--prompts', 'humaneval', '--max-tokens', '40', '--max-new-tokens', '20', '--keep', '200', "
            f"'--out', {str(out)!r}]); print(rc, 'torch' in sys.modules, 'transformers' in sys.modules)")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env={**__import__("os").environ, "OMP_NUM_THREADS": "1"})
    assert res.stdout.strip().splitlines()[-1] == "0 False False", res.stderr[-2000:]
    doc = json.loads(out.read_text())
    src = doc["provenance"]["sources"]["target"]
    assert src["engine"] == "BundleGenerator" and src["bundle"] == str(target_only_bundle)
    assert 0 < src["tokens"] <= 40 and len(doc["kept_ids"]) == 200
    from edgespec.export.kept_vocab import load_vocab_file
    from edgespec.runtime.bundle.vocab import tokenizer_info

    d = tokenizer_info(tiny_models["tiny-bl-b"])
    assert load_vocab_file(out, d.vocab_hash, doc["tokenizer"]["vocab_size"], d.special_ids).ids.size == 200


@pytest.mark.parametrize("case,match", [
    ("tokenizer", "its target tokenizer is not the pair's target tokenizer"),
    ("both", "give --bundle or --target-bundle, not both"),
    ("raw", "--target-bundle generates the target source"),
])
def test_target_bundle_bad_input(tmp_path, tiny_models, target_only_bundle, tiny_same_bundle, capsys, case, match):
    a, b, sp = tiny_models["tiny-bl-a"], tiny_models["tiny-bl-b"], tiny_models["tiny-sp"]
    gen = ["--source", "target", "--prompts", "humaneval", "--max-tokens", 8, "--keep", 50]
    args = {
        "tokenizer": ["--target", sp, "--drafter", b, "--target-bundle", target_only_bundle, *gen],
        "both": ["--bundle", tiny_same_bundle, "--target-bundle", target_only_bundle, *gen],
        "raw": ["--target", a, "--drafter", b, "--target-bundle", target_only_bundle, "--source", "raw", "--data", RAW,
                "--keep", 50],
    }[case]
    rc, err = _run(*args, "--out", tmp_path / "v.json", capsys=capsys)
    assert rc == 2 and "edgespec: error:" in err and match in err and err.count("\n") == 1, err
    assert not list(tmp_path.iterdir())
