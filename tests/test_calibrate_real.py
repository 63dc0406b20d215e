"""`edgespec calibrate` on the real smollm-self pair (SmolLM2-135M from its pip package), small budgets."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from edgespec.cli import main

pytestmark = pytest.mark.real


def test_three_sources_through_the_smollm_bundle(tmp_path, smollm_self_bundle):
    from edgespec.runtime.samplers.rdk import Affinity
    from edgespec.runtime.bundle.vocab import vocab_hash

    stdlib_json = Path(json.__file__).parent
    out = tmp_path / "v.json"
    rc = main(["calibrate", "--quiet", "--bundle", str(smollm_self_bundle), "--source", "raw", "target", "drafter",
               "--mix", "2", "1", "1", "--data", str(stdlib_json / "*.py"), "--prompts", "humaneval",
               "--max-tokens", "48", "--max-new-tokens", "48", "--keep", "8192", "--affinity", "cooc",
               "--a-star", "--tf-positions", "64", "--save-text", str(tmp_path / "gen.jsonl"),
               "--heldout", str(stdlib_json.parent / "textwrap.py"), "--out", str(out)])
    assert rc == 0
    doc = json.loads(out.read_text())
    man = json.loads((smollm_self_bundle / "manifest.json").read_text())
    assert doc["tokenizer"]["vocab_hash"] == man["drafter"]["tokenizer"]["vocab_hash"]
    from tokenizers import Tokenizer

    assert doc["tokenizer"]["vocab_hash"] == vocab_hash(Tokenizer.from_file(str(smollm_self_bundle / "drafter" /
                                                                                 "tokenizer.json")))
    prov = doc["provenance"]
    assert len(doc["kept_ids"]) == 8192 and prov["source"] == "mix"
    src = prov["sources"]
    assert src["raw"]["tokens"] > 5000 and src["target"]["tokens"] == 48 and src["drafter"]["tokens"] == 48
    assert src["target"]["engine"] == src["drafter"]["engine"] == "BundleGenerator"
    assert prov["coverage"] > 0.95
    priors = tmp_path / "v.priors"
    prior = np.load(priors / "prior.npy", allow_pickle=False)
    assert prior.shape == (49152,) and abs(float(prior.sum(dtype=np.float64)) - 1) < 1e-5
    m = Affinity.load(priors / "affinity.npz")
    assert m.shape == (8192, 49152)
    rnd = json.loads((priors / "randomised.json").read_text())
    assert 0 < rnd["lambda"] < 1.2 and 0 <= rnd["a_star"] <= 1 and rnd["lambda_source"] == "onnx cpu"
    assert 0.5 < rnd["acceptance_sd"] <= 1.0
    curve = json.loads((tmp_path / "v.coverage.json").read_text())
    assert curve["heldout_info"]["tokens"] > 1000 and curve["heldout_kept"] > 0.8
    gen = [json.loads(line) for line in (tmp_path / "gen.jsonl").read_text().splitlines()]
    assert sum(len(g["token_ids"]) for g in gen) == 96
