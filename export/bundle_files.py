"""Writing a bundle's contents into a (temporary) directory: graphs, tokenizers, vocabulary maps,
priors, the pruned drafter and its checks, and the manifest (through edgespec.runtime.bundle.manifest).
export/bundle_writer.py decides what goes in and moves the finished directory into place."""
from __future__ import annotations

import gc
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
from tokenizers import Tokenizer

from edgespec.errors import ExportError
from edgespec.export import onnx_export as ox
from edgespec.export import last_logits, padded_attention, prune
from edgespec.export.prefill_graph import write_and_check
from edgespec.export.graph_info import io_names, weight_stats
from edgespec.export.kept_vocab import KeptVocab
from edgespec.export.onnx_export import CachedExport, check_inputs, ort_session, run_prefill_decode
from edgespec.export.progress import log
from edgespec.hashing import sha256_file
from edgespec.models.weights import ModelSource
from edgespec.runtime.bundle import manifest as mf
from edgespec.runtime.engine.kv import default_feeds
from edgespec.runtime.bundle.vocab import TokenizerInfo, build_maps, intersection_size, vocab_hash

PRIOR_FILES = ("prior.npy", "affinity.npz", "randomised.json")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
                   "generation_config.json", "config.json")
PRUNED_TOL = 1e-4
LINK_MIN_BYTES = 64 * 1024**2  # files this large are hard-linked from the export cache, not copied


@dataclass
class Side:
    """One model of the pair, as the writer needs it."""
    source: ModelSource
    graph: CachedExport          # the cached (full-head) graph and its export metadata
    info: dict                   # onnx_export.model_info: the HF config's shape
    tokenizer: TokenizerInfo


@dataclass
class BundleParts:
    """Everything one bundle is written from."""
    target: Side
    drafter: Side | None          # None: a target-only bundle
    kept: KeptVocab | None
    pair: str | None
    progress: bool = True
    transform: Callable[[Path], dict | None] | None = None   # runs after the checks, before hashing


def write_bundle(root: Path, parts: BundleParts) -> dict:
    """Fill the empty directory `root` with the bundle of `parts`; returns the manifest written."""
    if parts.drafter is None:
        return _write_target_only(root, parts)
    t, d, kept = parts.target, parts.drafter, parts.kept
    for sub in ("target", "drafter", "vocab"):
        (root / sub).mkdir()
    for name in t.graph.files:             # the target: the cached graph + a logits_to_keep input
        _place(t.graph.dir / name, root / "target" / name)
    last_logits.edit_file(root / "target" / "model.onnx")
    _copy_tokenizer(t.source.hf_dir, root / "target")
    _copy_tokenizer(d.source.hf_dir, root / "drafter")
    maps = _write_vocab(root, parts)
    priors = _copy_priors(kept, root / "vocab")
    pruned = _prune_drafter(root, d, kept.ids, maps["index_map"], parts.progress)
    t_check, d_check = t.graph.meta["check"], d.graph.meta["check"]
    t_diff = _check_target(t_check)

    updates = parts.transform(root) if parts.transform is not None else None
    padded_diff = padded_attention.write_and_check(root / "target", parts.progress)
    prefill_diff = write_and_check(root / "target", t.info["vocab_size"])

    # Graph statistics: from the export cache / the prune step, unless a transform changed the graphs.
    d_full_stats = d.graph.meta.get("weight_stats") or weight_stats(d.graph.onnx)
    if parts.transform is None:
        t_stats = t.graph.meta.get("weight_stats") or weight_stats(root / "target" / "model.onnx")
        d_stats = pruned["info"]["weight_stats"]
        ios = {"target": io_names(root / "target" / "model.onnx"),     # the cached graph + logits_to_keep
               "drafter": pruned["info"]["io"]}
    else:
        t_stats = weight_stats(root / "target" / "model.onnx")
        d_stats = weight_stats(root / "drafter" / "model.onnx")
        ios = {sub: io_names(root / sub / "model.onnx") for sub in ("target", "drafter")}
    files = mf.list_files(root)

    drafter = _side_entry(root, d, d_stats, ios["drafter"], "drafter")
    drafter.update({"kept": int(kept.ids.size), "params_pruned": d_stats["params"],
                    "params_full_graph": d_full_stats["params"],
                    "bytes_per_forward_full": d_full_stats["bytes_per_forward"],
                    "head": {k: v for k, v in pruned["info"].items() if k not in ("external_data", "weight_stats", "io")}})
    vocab = mf.vocab_entry(
        kept=int(kept.ids.size), provenance=kept.provenance, intersection=intersection_size(maps["d2t"]),
        kept_with_target=int((maps["index_map"] >= 0).sum()), target_vocab=int(t.info["vocab_size"]),
        drafter_vocab=int(d.info["vocab_size"]), target_tokenizer_size=t.tokenizer.vocab_size,
        drafter_tokenizer_size=d.tokenizer.vocab_size, priors=priors)
    checks = {"pruned_vs_full_max_abs_diff": pruned["diff"], "pruned_tolerance": PRUNED_TOL,
              "target_vs_torch_max_abs_diff": t_diff,
              "target_vs_torch": {k: t_check.get(k) for k in ("atol", "rtol", "max_excess_over_rtol", "ok",
                                                              "torch_logit_absmax")},
              "prefill_graph_vs_graph_max_abs_diff": prefill_diff,
              "padded_attention_vs_padded_steps_max_abs_diff": padded_diff,
              "drafter_vs_torch_max_abs_diff": d_check["target_vs_torch_max_abs_diff"],
              "drafter_vs_torch_ok": d_check.get("ok"), "constant_outputs_ok": pruned["constants_ok"],
              "input": t_check["input"]}
    manifest = mf.new_manifest(
        pair=parts.pair, same_tokenizer=maps["same_tokenizer"],
        target=_side_entry(root, t, t_stats, ios["target"], "target"), drafter=drafter, vocab=vocab,
        checks=checks, export={"versions": t.graph.meta.get("versions"), "task": ox.TASK}, files=files)
    if updates:
        _deep_merge(manifest, updates)
    mf.write_manifest(root, manifest)
    return manifest


def _check_target(t_check: dict) -> float:
    """The target graph's export-time check against torch: its max |diff|, ExportError if it failed."""
    t_diff = t_check["target_vs_torch_max_abs_diff"]
    if not (t_check["ok"] if "ok" in t_check else t_diff <= ox.TORCH_ATOL):
        raise ExportError(f"exported target logits differ from torch by {t_diff:.3g} (tolerance {ox.TORCH_ATOL} + "
                          f"{ox.TORCH_RTOL}*|logit|); no bundle written")
    return t_diff


def _write_target_only(root: Path, parts: BundleParts) -> dict:
    """A bundle without a drafter (manifest drafter and vocab null): `ar` and prompt lookup."""
    t = parts.target
    (root / "target").mkdir()
    for name in t.graph.files:
        _place(t.graph.dir / name, root / "target" / name)
    last_logits.edit_file(root / "target" / "model.onnx")
    _copy_tokenizer(t.source.hf_dir, root / "target")
    t_check = t.graph.meta["check"]
    t_diff = _check_target(t_check)
    updates = parts.transform(root) if parts.transform is not None else None
    padded_diff = padded_attention.write_and_check(root / "target", parts.progress)
    prefill_diff = write_and_check(root / "target", t.info["vocab_size"])
    onnx_path = root / "target" / "model.onnx"
    stats = weight_stats(onnx_path) if parts.transform is not None else \
        t.graph.meta.get("weight_stats") or weight_stats(onnx_path)
    io = io_names(onnx_path)          # the cached graph + logits_to_keep (export/last_logits.py)
    checks = {"target_vs_torch_max_abs_diff": t_diff,
              "target_vs_torch": {k: t_check.get(k) for k in ("atol", "rtol", "max_excess_over_rtol", "ok",
                                                              "torch_logit_absmax")},
              "prefill_graph_vs_graph_max_abs_diff": prefill_diff,
              "padded_attention_vs_padded_steps_max_abs_diff": padded_diff, "input": t_check["input"]}
    manifest = mf.new_manifest(pair=parts.pair, same_tokenizer=True, target=_side_entry(root, t, stats, io, "target"),
                               drafter=None, vocab=None, checks=checks,
                               export={"versions": t.graph.meta.get("versions"), "task": ox.TASK},
                               files=mf.list_files(root))
    if updates:
        _deep_merge(manifest, updates)
    mf.write_manifest(root, manifest)
    return manifest


def _side_entry(root: Path, side: Side, stats: dict, io: dict, sub: str) -> dict:
    src, meta = side.source, side.graph.meta
    return mf.side_entry(
        source={"spec": src.spec, "kind": src.kind, "name": src.name, "sha256": src.sha256}, sub=sub,
        external_data=(root / sub / prune.DATA_NAME).is_file(), model=side.info, params=int(meta["params"]),
        graph_params=stats["params"], bytes_per_forward=stats["bytes_per_forward"],
        dtype=meta.get("dtype", "float32"), quantization=_builder_quantization(meta),
        tokenizer=side.tokenizer.manifest(), io=io,
        graph=meta.get("graph") or {"kind": "optimum", "kv_cache": "copy"},
        min_forward_tokens=(meta.get("batch_invariance") or {}).get("min_forward_tokens", 1),
        export_cache_key=side.graph.dir.name)


def _write_vocab(root: Path, parts: BundleParts) -> dict:
    """The vocabulary maps and the kept-vocabulary file; returns the maps and whether the tokenizers match."""
    t_tokenizer = Tokenizer.from_file(str(root / "target" / "tokenizer.json"))
    d_tokenizer = Tokenizer.from_file(str(root / "drafter" / "tokenizer.json"))
    v_t, v_d = parts.target.info["vocab_size"], parts.drafter.info["vocab_size"]
    d2t, t2d = build_maps(t_tokenizer, d_tokenizer, v_t, v_d)
    d2t, t2d = d2t[:v_d], t2d[:v_t]
    ids = parts.kept.ids
    index_map = d2t[ids]
    np.save(root / "vocab" / "drafter_to_target.npy", d2t)
    np.save(root / "vocab" / "target_to_drafter.npy", t2d)
    np.save(root / "vocab" / "index_map.npy", index_map)
    np.save(root / "vocab" / "draft_ids.npy", ids)
    (root / "vocab" / "vocab.json").write_text(json.dumps(parts.kept.doc) + "\n", encoding="utf-8")
    return {"d2t": d2t, "index_map": index_map,
            "same_tokenizer": vocab_hash(t_tokenizer) == vocab_hash(d_tokenizer)}


def _prune_drafter(root: Path, d: Side, ids: np.ndarray, index_map: np.ndarray, progress: bool) -> dict:
    """Write the drafter with its head pruned to the kept columns, and check it against the full graph."""
    log(progress, f"pruning the drafter head to {ids.size} of {d.info['vocab_size']} columns")
    info = prune.prune_head(d.graph.onnx, root / "drafter", ids, index_map)
    for f in (root / "drafter").iterdir():
        if f.name.startswith("model.onnx") and f.name not in ("model.onnx", prune.DATA_NAME):
            f.unlink()
    gc.collect()
    graph = d.graph.meta.get("graph") or {}
    try:        # a graph for another EP (fp16, int4 with fp16 activations) runs on the CPU EP where ORT allows
        diff, constants_ok = _check_pruned(d.graph.onnx, root / "drafter" / "model.onnx", ids, index_map,
                                           d.info["vocab_size"], prepack=graph.get("precision") in ("int4", "int8"))
    except Exception as exc:  # noqa: BLE001 - ORT's own types: a kernel this CPU EP lacks
        if graph.get("ep", "cpu") == "cpu":
            raise
        diff, constants_ok = None, _constants_in_graph(root / "drafter" / "model.onnx", ids, index_map)
        log(progress, f"pruned drafter not run: its graph is {graph.get('precision')} for {graph.get('ep')} and the CPU "
                      f"EP cannot run it ({(str(exc).splitlines() or [''])[0][:120]})")
    if not constants_ok:
        raise ExportError("pruned drafter's index_map/draft_ids outputs do not match the kept vocabulary")
    if diff is not None and not diff <= PRUNED_TOL:
        raise ExportError(f"pruned drafter logits differ from the full drafter's at kept columns by {diff:.3g} "
                          f"(> {PRUNED_TOL}); no bundle written")
    return {"info": info, "diff": diff, "constants_ok": constants_ok}


def _builder_quantization(meta: dict) -> dict | None:
    g = meta.get("graph") or {}
    if g.get("kind") != "builder" or g.get("precision") in ("fp32", "fp16"):
        return None
    return {"scheme": g["precision"], "by": g["builder"], **g.get("options", {}),
            "batch_invariance": meta.get("batch_invariance")}


def _deep_merge(base: dict, upd: dict) -> None:
    for k, v in upd.items():
        if isinstance(v, dict) and isinstance(base.get(k), dict):
            _deep_merge(base[k], v)
        else:
            base[k] = v


# ----------------------------------------------------------------------------- files

def _place(src: Path, dst: Path) -> None:
    """Hard-link a large cached file into the bundle (same filesystem), else copy."""
    if src.stat().st_size >= LINK_MIN_BYTES:
        try:
            os.link(src, dst)
            return
        except OSError:
            pass
    shutil.copyfile(src, dst)


def _copy_tokenizer(hf_dir: Path, dst: Path) -> None:
    if not (hf_dir / "tokenizer.json").is_file():
        _make_fast_tokenizer(hf_dir, dst)
    for name in TOKENIZER_FILES:
        if (hf_dir / name).is_file() and not (dst / name).exists():
            shutil.copyfile(hf_dir / name, dst / name)
    cfg_path = dst / "tokenizer_config.json"
    if cfg_path.is_file() and not (dst / "chat_template.jinja").exists():
        tpl = json.loads(cfg_path.read_text(encoding="utf-8")).get("chat_template")
        if isinstance(tpl, str):
            (dst / "chat_template.jinja").write_text(tpl, encoding="utf-8")


def _make_fast_tokenizer(hf_dir: Path, dst: Path) -> None:
    try:
        from transformers import AutoTokenizer  # lazy: the [export] extra, only for a model without tokenizer.json

        # fix_mistral_regex=False: transformers' "incorrect regex pattern" warning is false for the
        # tokenizers we ship (Qwen2's pattern is right), as in calibrate/generate.py.
        tok = AutoTokenizer.from_pretrained(str(hf_dir), use_fast=True, fix_mistral_regex=False)
        tok.save_pretrained(str(dst))
    except Exception as exc:
        raise ExportError(f"{hf_dir} has no tokenizer.json and its tokenizer cannot be converted: {exc}") from exc
    if not (dst / "tokenizer.json").is_file():
        raise ExportError(f"{hf_dir}: no fast tokenizer (tokenizer.json) could be made")


def _copy_priors(kept: KeptVocab, dst: Path) -> dict:
    res = {"prior": None, "affinity": None, "randomised": None}
    if kept.priors_dir is None:
        return res
    src = kept.priors_dir
    # The calibrator records the priors' digests in the vocab file: refuse priors that changed since.
    digests = (kept.doc.get("provenance") or {}).get("priors_files") or {}
    if isinstance(digests, dict):
        for name, digest in digests.items():
            f = src / name
            if not f.is_file():
                raise ExportError(f"priors file {f} named by the vocab file is missing")
            if sha256_file(f) != digest:
                raise ExportError(f"priors file {f} does not match the vocab file (sha256 differs); recalibrate")
    if (src / "prior.npy").is_file():
        shutil.copyfile(src / "prior.npy", dst / "prior.npy")
        res["prior"] = "vocab/prior.npy"
    if (src / "affinity.npz").is_file():
        shutil.copyfile(src / "affinity.npz", dst / "affinity.npz")
        meta = {}
        if (src / "affinity.json").is_file():
            try:
                meta = json.loads((src / "affinity.json").read_text())
            except ValueError:
                meta = {}
        res["affinity"] = {"path": "vocab/affinity.npz", **meta}
    if (src / "randomised.json").is_file():
        shutil.copyfile(src / "randomised.json", dst / "randomised.json")
        try:
            res["randomised"] = json.loads((src / "randomised.json").read_text())
        except ValueError as exc:
            raise ExportError(f"{src / 'randomised.json'} is not valid JSON") from exc
    for extra in sorted(src.iterdir()):  # anything else the calibrator put there (small metadata)
        if extra.is_file() and extra.name not in PRIOR_FILES and not (dst / extra.name).exists() \
                and extra.stat().st_size < 16 * 1024**2:
            shutil.copyfile(extra, dst / extra.name)
    return res


# ----------------------------------------------------------------------------- pruned-drafter checks

def _constants_in_graph(path: Path, ids: np.ndarray, index_map: np.ndarray) -> bool:
    import onnx  # lazy: the [export] extra; `edgespec --help` imports this module
    from onnx import numpy_helper  # lazy: onnx is the [export] extra

    m = onnx.load(str(path), load_external_data=False)
    vals = {n.output[0]: numpy_helper.to_array(n.attribute[0].t, base_dir=str(path.parent)) for n in m.graph.node
            if n.op_type == "Constant" and n.output and n.output[0] in ("index_map", "draft_ids")}
    return (len(vals) == 2 and np.array_equal(vals["index_map"], index_map) and np.array_equal(vals["draft_ids"], ids))


def _check_pruned(full: Path, pruned: Path, ids: np.ndarray, index_map: np.ndarray, vocab_size: int,
                  prepack: bool = False) -> tuple[float, bool]:
    """ORT pruned vs ORT full at the kept columns (max |diff|), and whether the constant outputs match."""
    x = check_inputs(vocab_size, seed=4321)
    sess = ort_session(full, prepack=prepack)
    ref = run_prefill_decode(sess, x)[..., ids]
    del sess
    gc.collect()
    sess = ort_session(pruned, prepack=prepack)
    got = run_prefill_decode(sess, x)
    consts = sess.run(["index_map", "draft_ids"], {
        "input_ids": x[:, :1], "attention_mask": np.ones((1, 1), np.int64),
        **({"position_ids": np.zeros((1, 1), np.int64)} if any(i.name == "position_ids" for i in sess.get_inputs()) else {}),
        **{i.name: np.zeros([1, int(i.shape[1]), 0, int(i.shape[3])],
                            np.float16 if i.type == "tensor(float16)" else np.float32)
           for i in sess.get_inputs() if i.name.startswith("past_key_values.")}, **default_feeds(sess)})
    del sess
    gc.collect()
    if got.shape != ref.shape:
        raise ExportError(f"pruned drafter logits have shape {got.shape}, expected {ref.shape}")
    ok = bool(np.array_equal(consts[0], index_map) and np.array_equal(consts[1], ids))
    return float(np.max(np.abs(got - ref))), ok
