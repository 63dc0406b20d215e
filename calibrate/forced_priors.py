"""The teacher-forced part of a calibration: sequences -> (p, q') positions -> affinity M and a*.
(The passes themselves, with their logits and alignment, are forced_logits.py's.)

Calibration sequences per source, with the positions budget (--tf-positions) split by the mix weights:
  target/drafter  the generated completions after their prompts (only generated tokens are positions);
  raw             excerpts of the raw corpus (the first chunk of files drawn in a seeded order).
Every 5th sequence is held out from M's estimate and used to report the acceptance sum min(p, d) of
TLI, exact RDK with the new M and Taylor RDK with the prior (a quick check that M helps).
"""
from __future__ import annotations

import random
from pathlib import Path

import numpy as np

from edgespec.calibrate.astar import AStarAccumulator
from edgespec.calibrate.counts import SkipFile, expand_inputs, iter_file_documents
from edgespec.calibrate.output import write_json
from edgespec.calibrate.priors import (IDENTITY_GRID, acceptance_on, make_estimator, mix_identity, save_affinity,
                                       top_entries)
from edgespec.calibrate.forced_logits import (AStarFeed, ByteOffsets, aligned_generation, aligned_sequence, run_pass,
                                        same_tokenizer_sequence)
from edgespec.errors import CalibrationError

HELDOUT_TOP = 512
DEFAULT_IDENTITY = 0.95       # identity weight when no held-out positions exist to choose one


def _sequences(cfg, models, source: str, gens: list):
    same = models.same_tokenizer
    offsets = None if same else (ByteOffsets(models.t_tok), ByteOffsets(models.d_tok))
    if source in ("target", "drafter"):
        t_off, d_off = offsets or (None, None)
        own, other = (t_off, d_off) if source == "target" else (d_off, t_off)
        for g in gens:
            ids = np.concatenate([g.prompt_ids, g.ids])
            if same:
                yield same_tokenizer_sequence(ids, g.prompt_ids.size, cfg.tf_max_len)
            else:
                yield aligned_generation(ids, g.prompt_text, own, other, source == "target", cfg.tf_max_len)
        return
    for text in sample_raw_texts(expand_inputs(cfg.data), 6 * cfg.tf_max_len, cfg.seed):
        if same:
            ids = np.asarray(models.d_tok.encode(text, add_special_tokens=True).ids, dtype=np.int64)
            yield same_tokenizer_sequence(ids, 1, cfg.tf_max_len)
        else:
            yield aligned_sequence(text, 0, *offsets, max_len=cfg.tf_max_len)


def sample_raw_texts(paths: list[Path], n_chars: int, seed: int, limit: int = 400) -> list[str]:
    """Deterministic sample of raw-text excerpts (file order shuffled with the seed) for teacher forcing."""
    order = list(paths)
    random.Random(seed).shuffle(order)
    out: list[str] = []
    for p in order[:limit]:
        try:
            for doc in iter_file_documents(p, "text"):
                if isinstance(doc, np.ndarray):
                    continue
                text = next(iter(doc), "")
                if text.strip():
                    out.append(text[:n_chars])
                break
        except (SkipFile, UnicodeDecodeError, OSError, EOFError):
            continue
    return out


class _Heldout:
    def __init__(self):
        self.p: list[tuple[np.ndarray, np.ndarray]] = []
        self.q: list[np.ndarray] = []

    def __call__(self, p: np.ndarray, q: np.ndarray) -> None:
        idx, val = top_entries(p, HELDOUT_TOP)
        for i in range(p.shape[0]):
            self.p.append((idx[i], val[i].astype(np.float64)))
            self.q.append(q[i].astype(np.float32))


def teacher_forced_priors(cfg, models, kept_ids: np.ndarray, gens: dict, weights: list[float], priors_dir: Path,
                          prior: np.ndarray) -> dict:
    kept_ids = np.asarray(kept_ids, dtype=np.int64)
    index_map = models.d2t[kept_ids]
    consumers, every = [], []
    estimator = astar = None
    if cfg.affinity:
        estimator = make_estimator(cfg.affinity, index_map, models.v_t)
        consumers.append(estimator)
    if cfg.a_star:
        astar = AStarAccumulator()
        every.append(AStarFeed(astar, index_map))        # a* uses every position
    heldout = _Heldout() if estimator is not None else None
    block = 0
    target_fn = models.target_logits()
    drafter_fn, drafter_desc = models.drafter_logits(kept_ids)
    totals = {"positions": 0, "heldout_positions": 0, "sequences": 0, "skipped_sequences": 0}
    for source, w in zip(cfg.sources, weights):
        budget = int(round(cfg.tf_positions * w))
        if budget < 1:
            continue
        stats = run_pass(_sequences(cfg, models, source, gens.get(source) or []), target_fn, drafter_fn,
                         index_map, cfg.prior_temperature, consumers, budget, heldout=heldout, every=every,
                         progress=cfg.progress, block_offset=block)
        block = stats.blocks
        for k in totals:
            totals[k] += getattr(stats, k)
    if totals["positions"] == 0:
        raise CalibrationError("teacher-forced pass: no usable positions (empty calibration text, or no aligned "
                               f"token boundaries between the two tokenizers; {totals['skipped_sequences']} "
                               "sequence(s) skipped)")
    common = {"temperature": cfg.prior_temperature, "drafter_logits": drafter_desc,
              "sequences": totals["sequences"], "skipped_sequences": totals["skipped_sequences"],
              "tf_max_len": cfg.tf_max_len, "sources": dict(zip(cfg.sources, weights))}
    meta: dict = {}
    if estimator is not None:
        csr, info = estimator.build(cfg.affinity_topk, tau=cfg.affinity_tau)
        csr, choice = _choose_identity_weight(cfg, csr, index_map, models.v_t, heldout, prior)
        info.update(choice)
        save_affinity(priors_dir / "affinity.npz", csr, (int(kept_ids.size), int(models.v_t)))
        info.update(common, positions=totals["positions"], heldout_positions=totals["heldout_positions"])
        write_json(priors_dir / "affinity.json", info)
        meta["affinity"] = {"file": "affinity.npz", **info}
    if astar is not None:
        if cfg.lam is not None:
            lam, lam_src = float(cfg.lam), "given (--lambda)"
        else:
            lam, lam_src = models.measure_lambda()
        res = astar.solve(lam)
        res.update({"lambda_source": lam_src, **common})      # res["positions"]: all positions (a* holds none out)
        write_json(priors_dir / "randomised.json", res)
        meta["randomised"] = {"file": "randomised.json", "a_star": res["a_star"], "lambda": res["lambda"]}
    return meta


def _choose_identity_weight(cfg, csr, index_map, v_t: int, heldout, prior) -> tuple[tuple, dict]:
    """Shrink M toward the identity (RDK -> TLI) by the weight with the best held-out acceptance
    sum min(p, M^T q'); ties go to the larger weight. A fixed --affinity-identity W skips the search."""
    k = cfg.affinity_topk
    have = heldout is not None and len(heldout.q) > 0
    base = acceptance_on(heldout.p, heldout.q, index_map, v_t, None, prior) if have else {}
    if cfg.affinity_identity != "auto":
        w = float(cfg.affinity_identity)
        out = mix_identity(csr, index_map, w, k)
        if have:
            base["acceptance_rdk"] = acceptance_on(heldout.p, heldout.q, index_map, v_t, out)["acceptance_rdk"]
        return out, {"identity_weight": w, "identity_weight_source": "given", "heldout_check": base}
    if not have:
        w = DEFAULT_IDENTITY
        return mix_identity(csr, index_map, w, k), {"identity_weight": w, "identity_weight_source":
                                                    "default (no held-out positions)", "heldout_check": base}
    scores = {}
    for w in IDENTITY_GRID:
        scores[w] = acceptance_on(heldout.p, heldout.q, index_map, v_t, mix_identity(csr, index_map, w, k))[
            "acceptance_rdk"]
    best = max(IDENTITY_GRID, key=lambda w: (round(scores[w], 9), w))
    base["acceptance_rdk"] = scores[best]
    base["acceptance_rdk_by_identity_weight"] = {str(w): v for w, v in scores.items()}
    return mix_identity(csr, index_map, best, k), {"identity_weight": best,
                                                   "identity_weight_source": "best held-out acceptance",
                                                   "heldout_check": base}
