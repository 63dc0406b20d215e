"""`edgespec study acceptance`: expected acceptance under drafter-vocabulary pruning (RDK paper, Fig. 7/12).

Method (teacher-forced, bounded memory):
1. Texts. `--prompts SPEC` (default humaneval): calibration = its calib split, held-out = its test split.
   `--text FILES`: excerpts of raw files, alternately calibration and held-out. Never evaluated on
   what was calibrated on.
2. Logits. The target: the bundle's ONNX graph (or torch from the HF directory without a bundle).
   The drafter with its FULL head: the target graph when drafter and target are the same model;
   else the unpruned drafter ONNX left in the export cache by `edgespec export` (manifest
   drafter.export_cache_key); else torch from the drafter's HF directory. Pruning to a kept set S is
   column masking of these full logits, which is exact.
3. Calibration positions give the drafter-column ranking (token counts, ties by summed drafter
   probability: frequency-ranked pruning as in FR-Spec/VocabTrim), the target unigram prior (for
   rdk-taylor) and the affinity M over all drafter columns with each estimator (calibrate/priors.py);
   at kept size K the study uses the rows of M for the K kept columns.
4. Held-out positions: for each kept size, alpha = sum min(p, d) of every sampler (study/samplers.py),
   kept per position (a few floats each); positions are processed in chunks of 32 rows. Each row
   reports alpha, its standard error std/sqrt(n), and the paired difference to TLI at the same kept
   size with its standard error (same positions, so far tighter than the two SEs combined).
Outputs in OUT/: alphas.npz (per-position alpha of every row, keyed by row label), acceptance.csv,
acceptance.png (alpha against the fraction pruned, one line per sampler), study.json (settings,
provenance and the same rows), and with a bundle the VocabTrim view (expected tau and MBSU(c_params)
of TLI against K) in vocabtrim.png.
"""
from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from tqdm import tqdm

from edgespec.calibrate.counts import expand_inputs
from edgespec.calibrate.forced_logits import OrtLogits, text_sequences
from edgespec.calibrate.forced_priors import sample_raw_texts
from edgespec.calibrate.pair import resolve_models
from edgespec.calibrate.priors import ESTIMATORS, make_estimator, unigram_prior
from edgespec.calibrate.prompts import load_prompts
from edgespec.paths import exports_dir
from edgespec.profiler import mbsu as M
from edgespec.profiler.study import report as study_report
from edgespec.profiler.errors import StudyError
from edgespec.profiler.study.samplers import (attach_samplers, attach_slrs_bound, level_alphas, make_level,
                                              sampler_label, taylor_samplers)
from edgespec.runtime.samplers.rdk import DEFAULT_TOL
from edgespec.runtime.samplers.sampling import softmax
from edgespec.runtime.samplers.tli import tli_rows

CHUNK = 32
DEFAULT_KEPT = [1, 2, 5, 10, 25, 50, 75, 100]
DEFAULT_BETAS = [1.0, 1e3, 1e4, 1e5, 1e6, 1e7]


@dataclass
class StudyConfig:
    out: Path
    bundle: Path | None = None
    pair: str | None = None
    target: str | None = None
    drafter: str | None = None
    prompts: str | None = "humaneval"
    text: list[str] = field(default_factory=list)
    kept_percent: list[float] = field(default_factory=lambda: list(DEFAULT_KEPT))
    betas: list[float] = field(default_factory=lambda: list(DEFAULT_BETAS))
    estimators: list[str] = field(default_factory=lambda: ["cooc", "cov"])
    affinity_topk: int = 32
    affinity_tau: float = 0.1
    positions: int = 2000
    calib_positions: int = 2000
    max_len: int = 256
    temperature: float = 1.0
    gamma: int = 4
    export_cache: Path | None = None
    ep: str = "cpu"
    threads: int | None = 1
    seed: int = 0
    progress: bool = True
    command: str = ""
    chat: bool | None = False       # read by calibrate.pair.resolve_models


def check_config(cfg: StudyConfig) -> None:
    if not cfg.kept_percent or any(not 0 < k <= 100 for k in cfg.kept_percent):
        raise StudyError(f"--kept needs percentages in (0, 100], got {cfg.kept_percent}")
    if any(not (np.isfinite(b) and b >= 0) for b in cfg.betas):
        raise StudyError(f"--betas must be finite numbers >= 0, got {cfg.betas}")
    unknown = [e for e in cfg.estimators if e not in ESTIMATORS]
    if unknown:
        raise StudyError(f"unknown M estimator(s) {', '.join(unknown)}; use {', '.join(ESTIMATORS)}")
    for name, v in (("--positions", cfg.positions), ("--calib-positions", cfg.calib_positions),
                    ("--max-len", cfg.max_len), ("--affinity-topk", cfg.affinity_topk), ("--gamma", cfg.gamma)):
        if v < 1:
            raise StudyError(f"{name} must be >= 1, got {v}")
    if not cfg.temperature > 0:
        raise StudyError(f"--temperature must be > 0 (expected acceptance needs distributions), got {cfg.temperature}")
    if not (cfg.prompts or cfg.text):
        raise StudyError("give --prompts humaneval|FILE.jsonl or --text FILES")
    try:
        Path(cfg.out).mkdir(parents=True, exist_ok=True)
        probe = Path(cfg.out) / ".edgespec-write-test"
        probe.write_bytes(b"ok")
        probe.unlink()
    except OSError as exc:
        raise StudyError(f"output directory {cfg.out} is not writable ({exc.strerror or exc})") from None


# --------------------------------------------------------------------------- texts and logits

def study_texts(cfg: StudyConfig) -> tuple[list[str], list[str], str]:
    """(calibration texts, held-out texts, description)."""
    if cfg.text:
        texts = sample_raw_texts(expand_inputs(cfg.text), 6 * cfg.max_len, cfg.seed)
        calib, held = texts[0::2], texts[1::2]
        desc = f"raw text {cfg.text}: {len(texts)} excerpts, even ones calibrate, odd ones held out"
    else:
        calib = [p.text for p in load_prompts(cfg.prompts, "calib") if p.text.strip()]
        held = [p.text for p in load_prompts(cfg.prompts, "test") if p.text.strip()]
        desc = f"prompts {cfg.prompts}: calib split calibrates, test split held out"
    if not calib or not held:
        raise StudyError(f"not enough text: {len(calib)} calibration and {len(held)} held-out text(s) from "
                         f"{cfg.text or cfg.prompts}")
    return calib, held, desc


def full_drafter_onnx(models, cfg: StudyConfig) -> Path | None:
    """The unpruned drafter graph the bundle was exported from, if still in the export cache."""
    if models.bundle is None:
        return None
    key = models.bundle.manifest["drafter"].get("export_cache_key")
    path = Path(cfg.export_cache or exports_dir()) / str(key) / "model.onnx"
    return path if key and path.is_file() else None


def logit_sources(models, cfg: StudyConfig):
    """(target_fn, drafter_fn, description): fn(ids, rows) -> logits [len(rows), V] (full heads)."""
    target_fn = models.target_logits()
    everything = np.arange(models.v_d, dtype=np.int64)
    t_desc = "bundle target graph (onnx)" if models.bundle is not None else "torch target"
    if models.same_model and models.same_tokenizer:
        fn, desc = models.drafter_logits(everything)
        return target_fn, fn, f"{t_desc}; drafter = {desc}"
    path = full_drafter_onnx(models, cfg)
    if path is not None:
        fn = OrtLogits(path, cols=None, ep=cfg.ep, threads=cfg.threads, role="drafter")
        return target_fn, fn, f"{t_desc}; drafter = unpruned onnx {path}"
    fn, desc = models.drafter_logits(everything)
    return target_fn, fn, f"{t_desc}; drafter = {desc}"


def position_chunks(models, texts, target_fn, drafter_fn, budget: int, cfg: StudyConfig, desc: str):
    """Yield (seq, p [s, V_t], q [s, V_d]) chunks of <= CHUNK positions, `budget` in all. The softmax
    runs in float64: pruning to 1% leaves tiny masses that float32 would flush to zero."""
    done = 0
    seqs = text_sequences(texts, cfg.max_len, models.t_tok, None if models.same_tokenizer else models.d_tok)
    with tqdm(total=budget, desc=desc, unit="pos", disable=not cfg.progress, file=sys.stderr) as bar:
        for seq in seqs:
            if done >= budget:
                break
            if seq is None:
                continue
            pairs = seq.pairs[: budget - done]
            t_logits = target_fn(seq.target_ids, pairs[:, 0])
            d_logits = drafter_fn(seq.drafter_ids, pairs[:, 1])
            for a in range(0, pairs.shape[0], CHUNK):
                p = softmax(t_logits[a:a + CHUNK], cfg.temperature, np.float64)
                q = softmax(d_logits[a:a + CHUNK], cfg.temperature, np.float64)
                yield seq, pairs[a:a + CHUNK], p, q
                bar.update(p.shape[0])
            done += pairs.shape[0]
    if done == 0:
        raise StudyError(f"{desc}: no usable positions (texts too short, or no aligned token boundaries)")


# --------------------------------------------------------------------------- the two passes

@dataclass
class Calibration:
    ranking: np.ndarray              # drafter columns, most frequent first
    prior: np.ndarray                # target unigram prior (float32 [V_t])
    affinities: dict                 # estimator -> CSR (data, indices, indptr) over all V_d rows
    info: dict
    structure: object = None         # prefix_affinity.TokenStructure when a structural M was asked for


def calibration_pass(models, texts, target_fn, drafter_fn, cfg: StudyConfig) -> Calibration:
    d2t = np.asarray(models.d2t, dtype=np.int64)
    d_counts, t_counts = np.zeros(models.v_d), np.zeros(models.v_t)
    q_mass = np.zeros(models.v_d)
    estimators = {e: make_estimator(e, d2t, models.v_t, tokenizers=(models.t_tok, models.d_tok))
                  for e in cfg.estimators}
    last, positions = None, 0
    for seq, _, p, q in position_chunks(models, texts, target_fn, drafter_fn, cfg.calib_positions, cfg,
                                        "calibration positions"):
        if seq is not last:
            d_counts += np.bincount(seq.drafter_ids, minlength=models.v_d)[: models.v_d]
            t_counts += np.bincount(seq.target_ids, minlength=models.v_t)[: models.v_t]
            last = seq
        q_mass += q.sum(axis=0)
        positions += p.shape[0]
        if estimators:
            q_tli = tli_rows(q, d2t, probs=True, dtype=np.float64, floor=1e-300)
            for est in estimators.values():
                est.add(p, q_tli)
    ranking = np.lexsort((-q_mass, -d_counts))         # by count, ties by summed drafter probability
    affinities, infos = {}, {}
    for name, est in estimators.items():
        csr, infos[name] = est.build(cfg.affinity_topk, tau=cfg.affinity_tau)
        affinities[name] = (np.asarray(csr[0], dtype=np.float64), np.asarray(csr[1], dtype=np.int64),
                            np.asarray(csr[2], dtype=np.int64))
    info = {"positions": positions, "drafter_tokens_counted": int(d_counts.sum()),
            "drafter_tokens_seen": int((d_counts > 0).sum()), "prior_alpha": 0.5, "affinity": infos}
    structure = next((e.structure for e in estimators.values() if hasattr(e, "structure")), None)
    return Calibration(ranking, unigram_prior(t_counts, 0.5), affinities, info, structure)


def heldout_pass(models, texts, target_fn, drafter_fn, cal: Calibration, cfg: StudyConfig) -> tuple[list, int, dict]:
    """alpha per position for every (sampler, kept level); returns (rows, positions, per-position arrays)."""
    d2t = np.asarray(models.d2t, dtype=np.int64)
    taylor = taylor_samplers(cal.prior, cfg.betas)
    levels = []
    for pct in sorted(set(cfg.kept_percent)):
        level = make_level(pct, cal.ranking, d2t)
        attach_samplers(level, taylor, cal.affinities, models.v_t)
        if cal.structure is not None:
            attach_slrs_bound(level, cal.structure, models.v_t)
        levels.append(level)
    per_position: dict = {}
    positions = 0
    for _, _, p, q in position_chunks(models, texts, target_fn, drafter_fn, cfg.positions, cfg,
                                      "held-out positions"):
        positions += p.shape[0]
        for level in levels:
            for key, a in level_alphas(p, q, level, DEFAULT_TOL).items():
                per_position.setdefault((key, level.percent, level.kept), []).append(a)
    rows, arrays = [], {}
    for (key, pct, kept), parts in per_position.items():
        a = np.concatenate(parts)
        tli = np.concatenate(per_position[(("tli", None), pct, kept)])
        rows.append({"sampler": key[0], "beta": key[1] if key[0] == "rdk-taylor" else None,
                     "estimator": key[1] if key[0] == "rdk" else None, "kept_percent": pct, "kept": kept,
                     "pruned_fraction": 1.0 - kept / models.v_d, "alpha": float(a.mean()),
                     "alpha_se": standard_error(a), "delta_vs_tli": float((a - tli).mean()),
                     "delta_vs_tli_se": standard_error(a - tli), "positions": positions})
        arrays[f"{sampler_label(key)} @ {pct:g}%"] = a
    return rows, positions, arrays


def standard_error(a: np.ndarray) -> float:
    """std / sqrt(n) of per-position values (population std, as the running sums gave before)."""
    return float(a.std() / np.sqrt(a.size)) if a.size else float("nan")


def vocabtrim_view(rows: list[dict], manifest: dict | None, gamma: int) -> None:
    """Adds expected tau (i.i.d. acceptance) and MBSU(c_params at that K) for every row, in place."""
    target_params = None if manifest is None else (manifest["target"].get("graph_params")
                                                  or manifest["target"].get("params"))
    for r in rows:
        r["tau"] = M.expected_tau(r["alpha"], gamma)
        params = None if manifest is None else M.params_at_kept(manifest, r["kept"])
        r["c_params"] = M.ratio(params, target_params)
        r["mbsu_params"] = M.mbsu(r["tau"], r["c_params"], gamma)


# --------------------------------------------------------------------------- driver

def run_study(cfg: StudyConfig) -> dict:
    t0 = time.time()
    check_config(cfg)
    calib_texts, held_texts, text_desc = study_texts(cfg)
    models = resolve_models(cfg)
    target_fn, drafter_fn, logits_desc = logit_sources(models, cfg)
    cal = calibration_pass(models, calib_texts, target_fn, drafter_fn, cfg)
    rows, positions, per_position = heldout_pass(models, held_texts, target_fn, drafter_fn, cal, cfg)
    manifest = models.bundle.manifest if models.bundle is not None else None
    vocabtrim_view(rows, manifest, cfg.gamma)
    rows.sort(key=lambda r: (r["sampler"], str(r["beta"]), str(r["estimator"]), r["kept_percent"]))
    doc = {"format": "edgespec-acceptance-study", "schema_version": 1, "settings": study_report.settings(cfg),
           "models": {"pair": models.pair, "inputs": models.inputs, "same_tokenizer": models.same_tokenizer,
                      "target_vocab": models.v_t, "drafter_vocab": models.v_d,
                      "intersection": int((np.asarray(models.d2t) >= 0).sum())},
           "texts": text_desc, "logits": logits_desc, "calibration": cal.info, "heldout_positions": positions,
           "max_alpha_se": max((r["alpha_se"] for r in rows), default=None),
           "elapsed_s": round(time.time() - t0, 1), "rows": rows}
    study_report.write(doc, Path(cfg.out))
    np.savez_compressed(Path(cfg.out) / "alphas.npz", **per_position)
    return doc
