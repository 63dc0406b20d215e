"""`calibrate(config)`: counts -> kept vocabulary -> priors -> atomic output (the CLI's engine).

Sources and mixing. Each source gives counts in the drafter's and in the target's vocabulary:
  raw      tokenise the --data corpus with both tokenizers (once when they are the same);
  target   the target generates completions of the prompts; counts map onto the drafter's vocabulary
           through the string maps (re-tokenising tokens without a counterpart, counts split);
  drafter  the same with the drafter generating, mapped onto the target's vocabulary.
Several sources combine as a weighted sum of their *normalised* frequencies (weights --mix, default
equal), rescaled to the total number of counted tokens, so a few thousand generated tokens can weigh
as much as millions of raw ones. One source alone gives exactly its counts.
"""
from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from edgespec.calibrate import priors
from edgespec.calibrate import select as sel
from edgespec.calibrate.counts import (TokenCounter, _open_binary, count_corpus, expand_inputs, is_jsonl,
                                       map_counts, sha256_file)
from edgespec.calibrate.forced_priors import teacher_forced_priors
from edgespec.calibrate.generate import BundleGenerator, generate_corpus, load_generations, save_generations
from edgespec.calibrate.output import AtomicOutput, file_digests, output_paths, save_npz, versions
from edgespec.calibrate.pair import resolve_models
from edgespec.calibrate.prompts import load_prompts, prompts_digest
from edgespec.errors import CalibrationError, EdgespecError
from edgespec.runtime.bundle.bundle import Bundle
from edgespec.runtime.bundle.manifest import manifest_sha256
from edgespec.runtime.bundle.vocab import vocab_hash

SOURCES = ("raw", "target", "drafter")


@dataclass
class CalibrationConfig:
    out: Path
    sources: list[str]
    policy: str | None                 # keep | coverage | min-count; None with `vocab`
    value: float | None
    pair: str | None = None
    target: str | None = None
    drafter: str | None = None
    bundle: Path | None = None
    target_bundle: Path | None = None  # the target's generations from this bundle's ONNX graph (target-only is fine)
    mix: list[float] | None = None
    data: list[str] = field(default_factory=list)
    jsonl_field: str = "text"
    max_raw_tokens: int | None = None
    prompts: str | None = None
    split: str = "calib"
    max_tokens: int = 4096
    max_new_tokens: int = 256
    temperature: float = 0.7
    top_p: float | None = None
    chat: bool | None = None
    affinity: str | None = None
    affinity_topk: int = 32
    affinity_tau: float = 0.1
    affinity_identity: str | float = "auto"
    a_star: bool = False
    lam: float | None = None
    prior_alpha: float = 0.5
    prior_temperature: float = 1.0
    tf_positions: int = 2048
    tf_max_len: int = 512
    heldout: list[str] = field(default_factory=list)
    generated: list[str] = field(default_factory=list)   # reuse --save-text files instead of generating
    save_text: Path | None = None
    seed: int = 0
    ep: str = "cpu"
    threads: int | None = 1
    progress: bool = True
    vocab: Path | None = None          # reuse this kept set (priors-only) instead of choosing one
    command: str = "(python API: edgespec.calibrate.calibrate)"


def _log(cfg: CalibrationConfig, msg: str) -> None:
    if cfg.progress:
        print(f"edgespec: {msg}", file=sys.stderr)


def check_config(cfg: CalibrationConfig) -> list[float]:
    """Validate what can be checked before any model is loaded; returns the mix weights."""
    if not cfg.sources:
        raise CalibrationError("give at least one --source (raw, target or drafter)")
    for s in cfg.sources:
        if s not in SOURCES:
            raise CalibrationError(f"unknown --source {s!r}; use raw, target or drafter")
    if len(set(cfg.sources)) != len(cfg.sources):
        raise CalibrationError("each --source may appear once")
    weights = cfg.mix or [1.0] * len(cfg.sources)
    if len(weights) != len(cfg.sources):
        raise CalibrationError(f"--mix gives {len(weights)} weight(s) for {len(cfg.sources)} source(s)")
    if any(not np.isfinite(w) or w < 0 for w in weights) or sum(weights) <= 0:
        raise CalibrationError("--mix weights must be non-negative and not all zero")
    if "raw" in cfg.sources and not cfg.data:
        raise CalibrationError("--source raw needs --data PATH_OR_GLOB")
    if {"target", "drafter"} & set(cfg.sources) and not (cfg.prompts or cfg.generated):
        raise CalibrationError("--source target/drafter needs --prompts humaneval|FILE.jsonl (or --generated FILE)")
    if cfg.target_bundle is not None:
        if cfg.bundle is not None:
            raise CalibrationError("give --bundle or --target-bundle, not both (--bundle already runs the target)")
        if "target" not in cfg.sources or cfg.generated:
            raise CalibrationError("--target-bundle generates the target source: add --source target (without "
                                   "--generated)")
    if cfg.save_text is not None and not Path(cfg.save_text).expanduser().parent.is_dir():
        raise CalibrationError(f"--save-text {cfg.save_text}: the directory does not exist")
    if cfg.save_text is not None and cfg.generated:
        raise CalibrationError("--save-text with --generated: those generations are saved already")
    if cfg.save_text is not None and not {"target", "drafter"} & set(cfg.sources):
        raise CalibrationError("--save-text needs a generated source (target or drafter)")
    if cfg.affinity is not None and cfg.affinity not in ("cooc", "cov"):
        raise CalibrationError(f"unknown --affinity {cfg.affinity!r}; use cooc or cov")
    if cfg.affinity_identity != "auto":
        try:
            w = float(cfg.affinity_identity)
        except (TypeError, ValueError):
            w = -1.0
        if not 0.0 <= w <= 1.0:
            raise CalibrationError(f"--affinity-identity must be 'auto' or a weight in [0, 1], got {cfg.affinity_identity}")
    if cfg.affinity_topk < 1:
        raise CalibrationError(f"--affinity-topk must be at least 1, got {cfg.affinity_topk}")
    if cfg.tf_positions < 1:
        raise CalibrationError(f"--tf-positions must be at least 1, got {cfg.tf_positions}")
    if (cfg.policy is None) == (cfg.vocab is None):
        raise CalibrationError("give one of --keep K, --coverage P, --min-count C, or --vocab VOCAB.json")
    if cfg.vocab is not None and Path(cfg.vocab).resolve() == Path(cfg.out).resolve():
        raise CalibrationError("--vocab and --out must differ")
    if cfg.policy == "coverage" and not 0 < cfg.value <= 1:
        raise CalibrationError(f"--coverage must be in (0, 1], got {cfg.value}")
    if cfg.policy == "keep" and cfg.value < 1:
        raise CalibrationError(f"--keep must be at least 1, got {cfg.value:g}")
    if cfg.policy == "min-count" and not cfg.value > 0:
        raise CalibrationError(f"--min-count must be positive, got {cfg.value:g}")
    total = float(sum(weights))
    return [w / total for w in weights]


def calibrate(cfg: CalibrationConfig) -> dict:
    """Run a calibration; returns the vocab.json document (also written to cfg.out)."""
    weights = check_config(cfg)
    with AtomicOutput(cfg.out) as out:
        models = resolve_models(cfg)
        per_source, gens = {}, {}
        for name in cfg.sources:
            per_source[name], gens[name] = _count_source(cfg, models, name)
        d_counts = _combine([per_source[s]["drafter"] for s in cfg.sources], weights)
        t_counts = _combine([per_source[s]["target"] for s in cfg.sources], weights)
        if cfg.vocab is not None:
            selection = sel.reuse(sel.read_vocab(cfg.vocab, models.d_tok), d_counts, models.v_d)
        else:
            selection = sel.select(d_counts, cfg.policy, cfg.value, models.always_kept)
        _log(cfg, f"kept {selection.kept_ids.size} of {models.v_d} drafter tokens; coverage "
                  f"{selection.coverage:.4f} of the counted mass")
        curve = _curve(cfg, models, d_counts, selection, "+".join(cfg.sources))
        prior = priors.unigram_prior(t_counts, cfg.prior_alpha)
        np.save(out.priors / "prior.npy", prior)
        save_npz(out.priors / "counts.npz", drafter=d_counts, target=t_counts)
        priors_meta = {"prior": {"file": "prior.npy", "alpha": cfg.prior_alpha, "vocab_size": int(prior.size)}}
        if cfg.affinity or cfg.a_star:
            priors_meta.update(teacher_forced_priors(cfg, models, selection.kept_ids, gens, weights, out.priors, prior))
        if cfg.save_text is not None:
            save_generations(out.tmp / "generations.jsonl", gens, {"target": models.t_hash, "drafter": models.d_hash})
            out.extra[out.tmp / "generations.jsonl"] = Path(cfg.save_text)
        provenance = {
            "source": cfg.sources[0] if len(cfg.sources) == 1 else "mix",
            "sources": {s: per_source[s]["info"] for s in cfg.sources},
            "mix": dict(zip(cfg.sources, weights)),
            "corpus": _corpus_description(cfg),
            "tokens_counted": int(sum(per_source[s]["info"]["tokens"] for s in cfg.sources)),
            "heldout_coverage": curve.get("heldout_kept"),
            "pair": models.pair, "same_tokenizer": models.same_tokenizer,
            "inputs": models.inputs, "seed": cfg.seed, "command": cfg.command, "versions": versions(),
            "priors": priors_meta, "priors_files": file_digests(out.priors),
        }
        if cfg.vocab is not None:
            provenance["kept_from"] = {"vocab": str(cfg.vocab), "sha256": sha256_file(cfg.vocab)}
        priors_rel = output_paths(cfg.out)["priors"].name
        doc = sel.vocab_document(selection, models.d_hash, models.v_d, provenance, priors_rel)
        out.commit(doc, curve, plot=sel.plot_curve)
    _log(cfg, f"wrote {cfg.out} (+ {priors_rel}/, coverage curve)")
    return doc


def _combine(arrays: list[np.ndarray], weights: list[float]) -> np.ndarray:
    if len(arrays) == 1:
        return np.asarray(arrays[0], dtype=np.float64)
    total = sum(float(a.sum()) for a in arrays)
    out = np.zeros_like(np.asarray(arrays[0], dtype=np.float64))
    for a, w in zip(arrays, weights):
        s = float(a.sum())
        if s > 0:
            out += w * np.asarray(a, dtype=np.float64) / s
    return out * total


def _count_source(cfg: CalibrationConfig, models, name: str) -> tuple[dict, list]:
    if name == "raw":
        paths = expand_inputs(cfg.data)
        counters = [TokenCounter(models.d_tok, models.v_d, "drafter")]
        if not models.same_tokenizer:
            counters.append(TokenCounter(models.t_tok, models.v_t, "target"))
        _log(cfg, f"counting {len(paths)} file(s) of raw text")
        stats = count_corpus(paths, counters, cfg.jsonl_field, cfg.max_raw_tokens, cfg.progress)
        d = counters[0].counts.astype(np.float64)
        t = d if models.same_tokenizer else counters[1].counts.astype(np.float64)
        return {"drafter": d, "target": t, "info": {"kind": "raw", **stats.summary()}}, []
    size, other_size = (models.v_t, models.v_d) if name == "target" else (models.v_d, models.v_t)
    if cfg.generated:
        paths = expand_inputs(cfg.generated, "--generated")
        gens = load_generations(paths, name, models.t_hash if name == "target" else models.d_hash)
        info = {"kind": name, "engine": "saved generations (--generated)", "files": [str(p) for p in paths],
                "files_sha256": [sha256_file(p) for p in paths], "prompts_used": len(gens)}
        _log(cfg, f"{name}: {len(gens)} saved generation(s) from {len(paths)} file(s)")
    else:
        prompts = load_prompts(cfg.prompts, cfg.split)
        generator = _target_bundle_generator(cfg, models) if name == "target" and cfg.target_bundle else \
            models.generator(name)
        _log(cfg, f"{name} generates up to {cfg.max_tokens} tokens from {len(prompts)} prompt(s) "
                  f"({cfg.prompts}, split {cfg.split}; engine {type(generator).__name__})")
        gens = generate_corpus(generator, prompts, cfg.max_tokens, cfg.max_new_tokens, cfg.temperature, cfg.top_p,
                               cfg.seed, desc=f"{name} generating", progress=cfg.progress)
        info = {"kind": name, "engine": type(generator).__name__, **_engine_graph(generator),
                "prompts": cfg.prompts, "split": cfg.split,
                "prompts_used": len(gens), "prompts_sha256": prompts_digest(prompts), "temperature": cfg.temperature,
                "top_p": cfg.top_p, "max_new_tokens": cfg.max_new_tokens, "chat": generator.chat}
    own = np.bincount(np.concatenate([g.ids for g in gens]), minlength=size).astype(np.float64)[:size]
    info["tokens"] = int(own.sum())
    if models.same_tokenizer:
        other = own
    else:
        mapping = models.t2d if name == "target" else models.d2t
        src_tok, dst_tok = (models.t_tok, models.d_tok) if name == "target" else (models.d_tok, models.t_tok)
        mapped = map_counts(own, mapping, src_tok, dst_tok, other_size)
        other = mapped.counts
        info["mapped"] = {"direct": mapped.direct, "retokenised": mapped.retokenised, "unmapped": mapped.unmapped}
    d, t = (other, own) if name == "target" else (own, other)
    return {"drafter": d, "target": t, "info": info}, gens


def _target_bundle_generator(cfg: CalibrationConfig, models) -> BundleGenerator:
    """The target's ONNX graph from --target-bundle (e.g. the int4 target, exported before the drafter's
    vocabulary is known), refused unless its tokenizer is the calibrated pair's target tokenizer."""
    try:
        bundle = Bundle.load(cfg.target_bundle, verify="fast")
    except EdgespecError as exc:
        raise CalibrationError(f"--target-bundle {cfg.target_bundle}: {exc}") from None
    if vocab_hash(bundle.target.tokenizer) != models.t_hash:
        raise CalibrationError(f"--target-bundle {cfg.target_bundle}: its target tokenizer is not the pair's target "
                               "tokenizer")
    return BundleGenerator(bundle, cfg.ep, cfg.threads, cfg.chat)


def _engine_graph(generator) -> dict:
    """Which graph generated the text (recorded in the vocab's provenance)."""
    bundle = getattr(generator, "bundle", None)
    if bundle is None:
        return {}
    graph = bundle.manifest["target"].get("graph") or {}
    return {"bundle": str(bundle.path), "bundle_manifest_sha256": manifest_sha256(bundle.path),
            "graph": {k: graph.get(k) for k in ("kind", "precision") if k in graph}}


def _heldout_counts(path_specs: list[str], models) -> tuple[np.ndarray, dict]:
    """Counts of held-out text in the drafter vocabulary; generated jsonl files (--save-text) are
    read as their token ids when they were made with the drafter's tokenizer, else as text."""
    paths = expand_inputs(path_specs, "--heldout")
    counter = TokenCounter(models.d_tok, models.v_d, "drafter")
    by_field: dict[str, list[Path]] = {}
    for p in paths:
        by_field.setdefault(_heldout_field(p, models.d_hash) if is_jsonl(p) else "text", []).append(p)
    tokens = 0
    for fld, ps in by_field.items():
        tokens += count_corpus(ps, [counter], fld, None, progress=False).tokens
    return counter.counts.astype(np.float64), {"files": len(paths), "tokens": tokens}


def _heldout_field(path: Path, d_hash: str) -> str:
    with _open_binary(path) as f:
        line = f.readline()
    try:
        rec = json.loads(line)
    except ValueError:
        return "text"
    return "token_ids" if isinstance(rec, dict) and rec.get("vocab_hash") == d_hash and "token_ids" in rec else "text"


def _curve(cfg: CalibrationConfig, models, d_counts: np.ndarray, selection, source: str) -> dict:
    ks = sel.curve_points(models.v_d)
    order = sel.ranking(d_counts)
    doc = {"format": "edgespec-coverage", "source": source, "vocab_size": models.v_d, "k": ks.tolist(),
           "coverage": sel.coverage_curve(d_counts, ks, order).round(6).tolist(),
           "kept": int(selection.kept_ids.size), "kept_coverage": round(selection.coverage, 6),
           "ranking": "count descending, ties by lower id (special tokens not forced in)"}
    if cfg.heldout:
        h, info = _heldout_counts(cfg.heldout, models)
        name = Path(cfg.heldout[0]).name + (f" +{len(cfg.heldout) - 1}" if len(cfg.heldout) > 1 else "")
        doc["heldout"] = {name: sel.coverage_curve(h, ks, order).round(6).tolist()}
        doc["heldout_info"] = info
        doc["heldout_kept"] = round(sel.coverage_of(h, selection.kept_ids), 6)
        _log(cfg, f"held-out coverage of the kept set: {doc['heldout_kept']:.4f} ({info['tokens']} tokens)")
    return doc


def _corpus_description(cfg: CalibrationConfig) -> str:
    parts = []
    if "raw" in cfg.sources:
        parts.append("raw: " + " ".join(cfg.data))
    for s in ("target", "drafter"):
        if s in cfg.sources:
            parts.append(f"{s}-generated: {cfg.prompts} split {cfg.split}, <= {cfg.max_tokens} tokens")
    return "; ".join(parts)

