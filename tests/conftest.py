"""Shared fixtures. Tiny random models + real `tokenizers` tokenizers, exported at test time (no
downloads) into real bundles through edgespec's export code; built once per session (~10-20 s).

Fixtures (session-scoped unless noted):
  tiny_tokenizers      {"bytelevel": tokenizers.Tokenizer, "spiece": tokenizers.Tokenizer}
  tiny_models          {"tiny-bl-a": hf_dir, "tiny-bl-b": hf_dir, "tiny-sp": hf_dir}
  tiny_same_bundle     Path: target tiny-bl-a, drafter tiny-bl-b (same byte-level tokenizer), head pruned to 3/4
  tiny_self_bundle     Path: tiny-bl-a as both target and pruned drafter (greedy acceptance ~1)
  tiny_hetero_bundle   Path: target tiny-bl-a (byte-level), drafter tiny-sp (SentencePiece-style, pruned)
  tiny_int4_bundle     Path: tiny-bl-a as target and pruned drafter, int4 (accuracy_level 4: 1-token target
                       steps padded to 2, min_forward_tokens), with the target's prefill graph
  tiny_padded_bundle   Path: tiny-bl-a builder int4 pair whose target pads 1-token steps, with a padded-attention graph
  tiny_export_cache    Path of the ONNX export cache the tiny bundles used
  copy_bundle          (function) copy_bundle(path) -> a private copy under tmp_path, safe to corrupt
  smollm_self_bundle   Path: the real smollm-self pair exported with keep 8192 (marks: use with @pytest.mark.real)

Never modify the session bundles in place: they are shared. Use `copy_bundle` first.
Builder code lives in tests/tinymodels.py (`import tinymodels` works in tests: this file puts
tests/ on sys.path).
"""
from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

_TESTS = Path(__file__).resolve().parent
if str(_TESTS) not in sys.path:
    sys.path.insert(0, str(_TESTS))

import tinymodels  # noqa: E402

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Decoders plan from the export's checks (runtime/planning/plan.py `export_plan`) unless a test says otherwise:
# a device profile measured after a test's first generation would change later tests' plans.
os.environ.setdefault("EDGESPEC_DEVICE_PROFILE", "off")


@pytest.fixture(scope="session")
def tiny_workdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("edgespec-tiny")


@pytest.fixture(scope="session")
def _tiny_build(tiny_workdir) -> dict:
    return tinymodels.build_tiny_bundles(tiny_workdir)


@pytest.fixture(scope="session")
def tiny_tokenizers(_tiny_build) -> dict:
    return _tiny_build["tokenizers"]


@pytest.fixture(scope="session")
def tiny_models(_tiny_build) -> dict:
    return _tiny_build["models"]


@pytest.fixture(scope="session")
def tiny_export_cache(_tiny_build, tiny_workdir) -> Path:
    return tiny_workdir / "onnx-cache"


@pytest.fixture(scope="session")
def tiny_same_bundle(_tiny_build) -> Path:
    return _tiny_build["same"]


@pytest.fixture(scope="session")
def tiny_self_bundle(_tiny_build) -> Path:
    return _tiny_build["self"]


@pytest.fixture(scope="session")
def tiny_hetero_bundle(_tiny_build) -> Path:
    return _tiny_build["hetero"]


@pytest.fixture(scope="session")
def tiny_int4_bundle(tiny_models, tiny_export_cache, tmp_path_factory) -> Path:
    import json

    from edgespec.export.bundle_writer import export_bundle
    from edgespec.export.quantize_bundle import make_transform
    m = tiny_models["tiny-bl-a"]
    n = json.loads((m / "config.json").read_text())["vocab_size"]
    return export_bundle(str(m), str(m), tmp_path_factory.mktemp("int4") / "b", keep=(3 * n) // 4, pair="tiny-q",
                         progress=False, cache=tiny_export_cache, transform=make_transform("int4", "int4", quality_tokens=0))


@pytest.fixture(scope="session")
def tiny_padded_bundle(tiny_models, tmp_path_factory) -> Path:
    """A tiny builder int4 pair exported with the batch-invariance tolerance at 0: its target asks for
    padded 1-token steps and has a padded-attention graph (tests/test_padded_attention.py)."""
    import json

    from edgespec.export import quality
    from edgespec.export.bundle_writer import export_bundle
    m = tiny_models["tiny-bl-a"]
    n = json.loads((m / "config.json").read_text())["vocab_size"]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(quality, "BATCH_TOL", 0.0)
        return export_bundle(str(m), str(m), tmp_path_factory.mktemp("padded") / "b", keep=(3 * n) // 4,
                             pair="tiny-int4", graph="builder", progress=False,
                             cache=tmp_path_factory.mktemp("padded-cache"),
                             builder={"target": "int4", "drafter": "int4", "quality_tokens": 0})


@pytest.fixture
def copy_bundle(tmp_path):
    """Return a function making a private, writable copy of a bundle (for corruption tests)."""
    def _copy(path: Path, name: str = "bundle") -> Path:
        dst = tmp_path / name
        shutil.copytree(path, dst)
        return dst

    return _copy


@pytest.fixture(scope="session")
def smollm_self_bundle(tmp_path_factory) -> Path:
    """The real smollm-self pair, keep 8192 (SmolLM2 from its pip package; the export is cached in the
    user's edgespec cache, so later sessions reuse it). Only for tests marked `real`."""
    from edgespec.cli import main

    out = tmp_path_factory.mktemp("smollm") / "smollm-self"
    rc = main(["export", "--pair", "smollm-self", "--keep", "8192", "--out", str(out), "--quiet"])
    assert rc == 0 and (out / "manifest.json").is_file()
    return out
