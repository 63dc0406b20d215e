"""`edgespec study synthetic` (RDK paper Fig. 7 on synthetic Student-t targets): invariants of the
samplers on a tiny vocabulary, Eq. 2's closed form against the dense matrix, determinism and the CLI."""
from __future__ import annotations

import csv
import json
import math

import numpy as np
import pytest

from edgespec.cli import main
from edgespec.profiler.errors import StudyError
from edgespec.profiler.study.synthetic import SyntheticConfig, eq2_rdk, logit_variance, run_synthetic, synthetic_chunks

V = 1500
KEPT = [15, 150, 600, V]


def _cfg(tmp_path, **kw) -> SyntheticConfig:
    base = dict(out=tmp_path / "syn", vocab=V, kept=KEPT, positions=40, calib_positions=24, noise=1.0,
                betas=[1.0, 1e3], estimators=["cooc"], progress=False)
    base.update(kw)
    return SyntheticConfig(**base)


@pytest.fixture(scope="module")
def doc(tmp_path_factory):
    return run_synthetic(_cfg(tmp_path_factory.mktemp("syn")))


def _rows(doc) -> dict:
    return {(r["label"], r["kept"]): r for r in doc["rows"]}


def test_every_sampler_at_every_kept_size_with_acceptance_in_unit_interval(doc):
    labels = {r["label"] for r in doc["rows"]}
    assert {"masked", "TLI", "rdk M=cooc", "rdk M=eq2 τ=1", "rdk-taylor β=1 (p = prior)",
            "rdk-taylor β=1 (p = target)", "rdk-taylor β=1000 (p = target)"} <= labels
    assert len(doc["rows"]) == len(labels) * len(KEPT)
    for r in doc["rows"]:
        assert -1e-12 <= r["alpha"] <= 1 + 1e-12 and r["alpha_se"] >= 0 and r["positions"] == 40


def test_unpruned_samplers_equal_the_unpruned_acceptance(doc):
    """At K = V: masked and TLI are q itself; Eq. 3 moves at most ~ beta theta / N of mass."""
    rows = _rows(doc)
    unpruned = doc["target"]["unpruned_alpha_mean"]
    assert unpruned < 0.99                                  # noise = 1: the drafter is not the target
    for lab in ("masked", "TLI"):
        assert rows[(lab, V)]["alpha"] == pytest.approx(unpruned, abs=1e-12)
    for lab in ("rdk-taylor β=1 (p = prior)", "rdk-taylor β=1 (p = target)"):
        assert rows[(lab, V)]["alpha"] == pytest.approx(unpruned, abs=2.0 / V)


def test_tli_never_below_masked_and_pruning_costs_tli(doc):
    rows = _rows(doc)
    for k in KEPT:
        assert rows[("TLI", k)]["alpha"] >= rows[("masked", k)]["alpha"] - 1e-12
        assert rows[("TLI", k)]["delta_vs_tli"] == 0.0
    tli = [rows[("TLI", k)]["alpha"] for k in KEPT]
    assert tli[0] < tli[-1]                                 # 1 % of the vocabulary loses acceptance


def test_eq2_rdk_is_the_dense_matrix_and_nearly_uniform_at_tau_1(doc):
    """The closed form equals M^T q' with Eq. 2's dense M on Omega = Var(z) I; with tau = 1 it is
    within the identity weight lambda of the uniform law, so its acceptance does not depend on K."""
    rng = np.random.default_rng(3)
    n, var, tau = 40, 2.5, 0.7
    omega = var * np.eye(n)
    m = np.exp(omega / tau)
    m /= m.sum(axis=1, keepdims=True)
    q = rng.dirichlet(np.ones(n))
    assert np.allclose(eq2_rdk(q, var, tau), m.T @ q, rtol=0, atol=1e-15)
    lam = doc["target"]["eq2_identity_weight"]
    assert 0 < lam < 0.01
    for k in KEPT:
        a = _rows(doc)[("rdk M=eq2 τ=1", k)]["alpha"]
        assert abs(a - doc["target"]["uniform_alpha_mean"]) <= 2 * lam


def test_synthetic_targets_follow_the_settings(tmp_path):
    cfg = _cfg(tmp_path, noise=0.0)
    (p, q), = list(synthetic_chunks(cfg, np.random.default_rng(0), 5))
    assert p.shape == (5, V) and q is p and np.allclose(p.sum(axis=1), 1.0)
    assert logit_variance(cfg) == pytest.approx(cfg.scale ** 2 * 5 / 3)
    assert math.isinf(logit_variance(_cfg(tmp_path, df=2.0)))


def test_same_seed_same_numbers_other_seed_other_numbers(tmp_path, doc):
    again = run_synthetic(_cfg(tmp_path))
    assert [(r["label"], r["kept"], r["alpha"], r["alpha_se"]) for r in again["rows"]] == \
           [(r["label"], r["kept"], r["alpha"], r["alpha_se"]) for r in doc["rows"]]
    other = run_synthetic(_cfg(tmp_path, seed=1))
    assert [r["alpha"] for r in other["rows"]] != [r["alpha"] for r in doc["rows"]]


def test_cli_writes_json_csv_and_png(tmp_path, capsys):
    out = tmp_path / "cli"
    rc = main(["study", "synthetic", "--vocab", "800", "--kept", "8,80,800", "--positions", "16",
               "--calib-positions", "16", "--out", str(out), "--quiet"])
    assert rc == 0
    assert "| K |" in capsys.readouterr().out
    doc = json.loads((out / "synthetic.json").read_text())
    assert doc["settings"]["vocab"] == 800 and doc["paper"]["rdk_alpha"] == 0.267
    assert (out / "synthetic.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with open(out / "synthetic.csv", newline="") as f:
        assert len(list(csv.DictReader(f))) == len(doc["rows"])
    with pytest.raises(StudyError):
        run_synthetic(_cfg(tmp_path, kept=[0, 10]))
    assert main(["study", "synthetic", "--vocab", "100", "--kept", "500", "--out", str(out), "--quiet"]) == 2
