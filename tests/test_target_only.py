"""Target-only bundles (no drafter): `ar` and prompt lookup (`ngram`) run; drafter strategies refuse
in one line that names `ngram`."""
from __future__ import annotations

import json

import pytest

from edgespec.errors import BundleError, ExportError, GenerationError
from edgespec.export.bundle_writer import export_bundle
from edgespec.runtime import Bundle, SpeculativeDecoder
from edgespec.runtime.bundle.manifest import write_manifest

PROMPT = "def add(a, b):\n    return a + b\n\ndef add(a, b):\n    return"


@pytest.fixture(scope="module")
def target_only(tiny_models, tiny_export_cache, tmp_path_factory):
    out = tmp_path_factory.mktemp("target-only") / "bundle"
    export_bundle(str(tiny_models["tiny-bl-a"]), None, out, progress=False, cache=tiny_export_cache)
    return out


def test_manifest_has_no_drafter(target_only):
    m = json.loads((target_only / "manifest.json").read_text())
    assert m["drafter"] is None and m["vocab"] is None and m["same_tokenizer"] is True
    assert not (target_only / "drafter").exists() and not (target_only / "vocab").exists()
    b = Bundle.load(target_only)
    assert not b.has_drafter and b.kept == 0 and "target only" in repr(b)


def test_ngram_and_auto_match_ar(target_only):
    dec = SpeculativeDecoder(target_only, strategy="ngram", draft_length=4, threads=1)
    ref = dec.variant("ar").generate(PROMPT, max_new_tokens=24).token_ids
    got = dec.generate(PROMPT, max_new_tokens=24)
    assert got.token_ids == ref and got.stats.drafted > 0
    auto = SpeculativeDecoder(target_only, threads=1)          # strategy="auto": ngram without a drafter
    assert auto.strategy.name == "ngram"
    assert auto.generate(PROMPT, max_new_tokens=24).token_ids == ref
    assert auto.variant("auto").strategy.name == "ngram"


@pytest.mark.parametrize("strategy", ["tli", "sd", "slem", "ngram-tli", "rdk-taylor"])
def test_drafter_strategies_refused_naming_ngram(target_only, strategy):
    with pytest.raises(GenerationError, match="has no drafter.*'ngram'"):
        SpeculativeDecoder(target_only, strategy=strategy, threads=1)
    dec = SpeculativeDecoder(target_only, strategy="ar", threads=1)
    with pytest.raises(GenerationError, match="has no drafter.*'ngram'"):
        dec.variant(strategy)


def test_export_refuses_keep_without_drafter(tiny_models, tmp_path):
    with pytest.raises(ExportError, match="target-only"):
        export_bundle(str(tiny_models["tiny-bl-a"]), None, tmp_path / "b", keep=10, progress=False)
    assert not (tmp_path / "b").exists()


def test_half_target_only_manifest_refused(target_only, copy_bundle):
    b = copy_bundle(target_only)
    m = json.loads((b / "manifest.json").read_text())
    m["vocab"] = {"kept": 3}
    write_manifest(b, m)
    with pytest.raises(BundleError, match="vocab section without the other"):
        Bundle.load(b)
    m["vocab"], m["same_tokenizer"] = None, False
    write_manifest(b, m)
    with pytest.raises(BundleError, match="same_tokenizer must be true"):
        Bundle.load(b)


def test_cli_generate_ngram(target_only, capsys):
    from edgespec.cli import main

    assert main(["generate", "--bundle", str(target_only), "--strategy", "ngram", "--max-new-tokens", "8",
                 "--threads", "1", "--prompt", PROMPT]) == 0
    assert capsys.readouterr().out.strip()
    assert main(["generate", "--bundle", str(target_only), "--strategy", "tli", "--prompt", PROMPT]) == 2
    err = capsys.readouterr().err
    assert "has no drafter" in err and "'ngram'" in err and len(err.strip().splitlines()) == 1
