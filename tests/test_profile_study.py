"""`edgespec study acceptance`: column masking of the full head reproduces the runtime's strategies,
the study's invariants on tiny bundles, and bad input."""
from __future__ import annotations

import csv
import json

import numpy as np
import pytest

from edgespec.cli import main
from edgespec.profiler.errors import StudyError
from edgespec.profiler.study.acceptance import StudyConfig, run_study
from edgespec.profiler.study.samplers import attach_samplers, level_alphas, make_level, taylor_samplers


@pytest.fixture(autouse=True)
def _one_thread(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")


@pytest.fixture
def prompts_file(tmp_path):
    texts = ["def add(a, b):\n    return a + b\n", "class Counter:\n    def __init__(self):\n        self.value = 0\n",
             "The quick brown fox jumps over the lazy dog.", "On edge devices memory bandwidth is the bottleneck.",
             "Please write a Python function that sorts a list.", "Speculative decoding lets a small drafter propose."]
    path = tmp_path / "p.jsonl"
    path.write_text("".join(json.dumps({"id": f"t{i}", "text": t}) + "\n" for i, t in enumerate(texts)))
    return path


def _softmax(x):
    z = np.exp(x - x.max(axis=-1, keepdims=True))
    return z / z.sum(axis=-1, keepdims=True)


def test_column_masking_equals_the_runtime_strategies():
    """alpha of tli / rdk-taylor / rdk from masked full logits == the runtime's own distributions on the
    pruned head's logits (the kept columns), for a map with unmapped and shared target ids."""
    from edgespec.runtime.samplers.rdk import Affinity, RdkTaylor, rdk_distribution
    from edgespec.runtime.samplers.sampling import SamplingParams
    from edgespec.runtime.samplers.tli import kept_columns, tli_distribution

    rng = np.random.default_rng(0)
    v_d, v_t, s = 40, 30, 3
    d2t = rng.integers(0, v_t, v_d)
    d2t[[3, 7, 11]] = -1                                 # no target counterpart
    logits = rng.normal(0, 2, (s, v_d))
    p = _softmax(rng.normal(0, 2, (s, v_t)))
    prior = _softmax(rng.normal(0, 1, v_t))
    rows = np.repeat(np.arange(v_d), 3)                  # a random row-stochastic M over all drafter columns
    cols = rng.integers(0, v_t, rows.size)
    m_full = Affinity.from_csr(np.full(rows.size, 1 / 3), cols, np.arange(0, rows.size + 1, 3), (v_d, v_t))
    level = make_level(50, rng.permutation(v_d), d2t)
    attach_samplers(level, taylor_samplers(prior, [1.0, 50.0]), {"m": (m_full.data, m_full.indices, m_full.indptr)},
                    v_t)
    alphas = level_alphas(p, _softmax(logits), level, tol=0.0)

    class PrunedBundle:                                  # what a bundle pruned to level.cols looks like
        index_map = d2t[level.cols]
        target = type("T", (), {"vocab_size": v_t})()

    state = kept_columns(PrunedBundle())
    params = SamplingParams(temperature=1.0)
    m_kept = Affinity.from_csr(*[np.asarray(a) for a in _rows(m_full, level.cols)], (level.cols.size, v_t))
    for i in range(s):
        kept_logits = logits[i, level.cols].astype(np.float32)
        q_tli = tli_distribution(state, kept_logits, params, np.zeros(v_t))
        assert alphas[("tli", None)][i] == pytest.approx(np.minimum(p[i], q_tli).sum(), abs=1e-6)
        for beta in (1.0, 50.0):
            d = RdkTaylor(prior, beta)(q_tli)
            assert alphas[("rdk-taylor", beta)][i] == pytest.approx(np.minimum(p[i], d).sum(), abs=1e-6)
        q_kept = np.zeros(level.cols.size)
        q_kept[state.valid_cols] = _softmax(kept_logits[state.valid_cols].astype(np.float64))
        d = rdk_distribution(q_kept, m_kept)
        assert alphas[("rdk", "m")][i] == pytest.approx(np.minimum(p[i], d).sum(), abs=1e-6)
        masked = np.zeros(v_t)
        full_q = _softmax(logits[i])
        np.add.at(masked, d2t[level.valid_cols], full_q[level.valid_cols])
        assert alphas[("masked", None)][i] == pytest.approx(np.minimum(p[i], masked).sum(), abs=1e-12)


def _rows(m, rows):
    data, idx, ptr = [], [], [0]
    for r in rows:
        a, b = m.indptr[r], m.indptr[r + 1]
        data.extend(m.data[a:b])
        idx.extend(m.indices[a:b])
        ptr.append(len(data))
    return np.array(data), np.array(idx), np.array(ptr)


def test_study_on_tiny_bundles(tiny_self_bundle, tiny_same_bundle, tiny_export_cache, prompts_file, tmp_path):
    base = dict(prompts=str(prompts_file), kept_percent=[5, 50, 100], betas=[1.0, 1e4], positions=60,
                calib_positions=60, max_len=48, export_cache=tiny_export_cache, progress=False)
    doc = run_study(StudyConfig(out=tmp_path / "self", bundle=tiny_self_bundle, **base))
    rows = {(r["sampler"], r["beta"], r["estimator"], r["kept_percent"]): r for r in doc["rows"]}
    assert len(rows) == 3 * (3 + 2 + 2)                 # masked, union, tli, 2 betas, 2 estimators at 3 sizes
    assert "drafter = target graph" in doc["logits"]
    for r in doc["rows"]:
        assert 0.0 <= r["alpha"] <= 1.0 + 1e-9 and r["positions"] == doc["heldout_positions"] > 0
        assert r["mbsu_params"] == pytest.approx(r["tau"] / (r["c_params"] * 4 + 1))
    for pct in (5, 50, 100):
        # drafter == target: renormalising cannot beat min(p, q) = p on the kept set
        assert rows[("tli", None, None, pct)]["alpha"] == pytest.approx(rows[("masked", None, None, pct)]["alpha"])
    with open(tmp_path / "self" / "acceptance.csv") as f:
        assert len(list(csv.DictReader(f))) == len(rows)
    assert (tmp_path / "self" / "acceptance.png").stat().st_size > 0

    doc = run_study(StudyConfig(out=tmp_path / "same", bundle=tiny_same_bundle, estimators=["cooc"], **base))
    assert "unpruned onnx" in doc["logits"]
    by = {(r["sampler"], r["beta"], r["kept_percent"]): r["alpha"] for r in doc["rows"]}
    for pct in (5, 50, 100):
        assert by[("tli", None, pct)] >= by[("masked", None, pct)] - 1e-12   # renormalising only adds mass


def test_study_cli_and_bad_input(tiny_self_bundle, prompts_file, tmp_path, capsys):
    rc = main(["study", "acceptance", "--bundle", str(tiny_self_bundle), "--prompts", str(prompts_file),
               "--kept", "10,100", "--betas", "1", "--estimators", "cooc", "--positions", "20",
               "--calib-positions", "20", "--quiet", "--out", str(tmp_path / "s")])
    assert rc == 0 and "| tli |" in capsys.readouterr().out
    for kw, msg in ((dict(kept_percent=[0]), "--kept"), (dict(kept_percent=[150]), "--kept"),
                    (dict(estimators=["magic"]), "estimator"), (dict(betas=[-1.0]), "betas"),
                    (dict(temperature=0.0), "temperature"), (dict(prompts=None, text=[]), "--prompts")):
        args = {"out": tmp_path / "bad", "bundle": tiny_self_bundle, "prompts": str(prompts_file), "progress": False}
        with pytest.raises(StudyError, match=msg):
            run_study(StudyConfig(**{**args, **kw}))
    one = tmp_path / "one.jsonl"
    one.write_text('{"id": "a", "text": "hello"}\n')
    with pytest.raises(StudyError, match="not enough text"):
        run_study(StudyConfig(out=tmp_path / "bad", bundle=tiny_self_bundle, prompts=str(one), progress=False))


@pytest.mark.real
def test_study_smollm_self(smollm_self_bundle, tmp_path):
    doc = run_study(StudyConfig(out=tmp_path / "s", bundle=smollm_self_bundle, prompts="humaneval",
                                kept_percent=[1, 10, 100], betas=[1.0, 1e5], estimators=["cooc"], positions=64,
                                calib_positions=64, max_len=128, progress=False))
    by = {(r["sampler"], r["beta"], r["kept_percent"]): r["alpha"] for r in doc["rows"]}
    assert by[("tli", None, 100)] > 0.99                 # the drafter is the target: alpha -> 1 unpruned
    assert by[("tli", None, 1)] < by[("tli", None, 100)]
    assert doc["heldout_positions"] == 64
