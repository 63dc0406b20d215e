"""`export_bundle`: target + pruned drafter -> an ONNX bundle (see docs/architecture.md).

The bundle is written into a temporary sibling directory and renamed into place only when
complete, so a failed or interrupted export leaves no half-written bundle. An existing output
directory is replaced only if it is an edgespec bundle (or empty).
"""
from __future__ import annotations

import datetime as _dt
import errno
import gc
import json
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from edgespec import __version__
from edgespec.errors import EdgespecError, ExportError
from edgespec.runtime.bundle import FORMAT, FORMAT_VERSION, MANIFEST
from edgespec.runtime.vocab import (VOCAB_FORMAT, VOCAB_FORMAT_VERSION, build_maps, intersection_size,
                                    read_vocab_file, tokenizer_info, vocab_hash)

PRIOR_FILES = ("prior.npy", "affinity.npz", "randomised.json")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
                   "generation_config.json", "config.json")
PRUNED_TOL = 1e-4
LINK_MIN_BYTES = 64 * 1024**2  # files this large are hard-linked from the export cache, not copied


@dataclass
class KeptVocab:
    ids: np.ndarray         # sorted drafter ids, int64
    provenance: dict
    doc: dict               # the vocab.json document written into the bundle
    priors_dir: Path | None


def _log(progress: bool, msg: str) -> None:
    if progress:
        print(f"edgespec: {msg}", file=sys.stderr, flush=True)


def free_bytes(path: Path) -> int:
    """Free bytes on the filesystem holding `path` (the nearest existing parent). Tests monkeypatch this."""
    p = Path(path).resolve()
    while not p.exists():
        p = p.parent
    return shutil.disk_usage(p).free


def is_bundle_dir(path: Path) -> bool:
    m = Path(path) / MANIFEST
    if not m.is_file():
        return False
    try:
        return json.loads(m.read_text()).get("format") == FORMAT
    except (OSError, ValueError):
        return False


def check_out_dir(out: Path) -> None:
    out = Path(out)
    if out.exists():
        if not out.is_dir():
            raise ExportError(f"output {out} exists and is not a directory")
        if any(out.iterdir()) and not is_bundle_dir(out):
            raise ExportError(f"output dir {out} exists and is not an edgespec bundle; refusing to overwrite it")


# ----------------------------------------------------------------------------- kept vocabulary

def first_k(k: int, vocab_size: int, specials: list[int]) -> np.ndarray:
    specials = sorted({int(s) for s in specials if 0 <= s < vocab_size})
    if len(specials) > k:
        raise ExportError(f"--keep {k} is smaller than the {len(specials)} special tokens that are always kept")
    kept = set(specials)
    i = 0
    while len(kept) < k and i < vocab_size:
        kept.add(i)
        i += 1
    return np.array(sorted(kept), dtype=np.int64)


def validate_keep(k: int | None, vocab_size: int | None = None) -> None:
    if k is None:
        return
    if k <= 0:
        raise ExportError(f"--keep must be a positive number of drafter tokens, got {k}")
    if vocab_size is not None and k > vocab_size:
        raise ExportError(f"--keep {k} is larger than the drafter vocabulary ({vocab_size})")


def load_vocab_file(path: Path, drafter_hash: str, vocab_size: int, specials: list[int]) -> KeptVocab:
    path = Path(path)
    doc = read_vocab_file(path, drafter_hash, ExportError)
    ids = doc["kept_ids"]
    arr = np.array(sorted(set(ids)), dtype=np.int64)
    if arr[0] < 0 or arr[-1] >= vocab_size:
        raise ExportError(f"vocab file {path}: kept id {int(arr[-1] if arr[-1] >= vocab_size else arr[0])} "
                          f"outside the drafter vocabulary (0..{vocab_size - 1})")
    missing = sorted(set(s for s in specials if 0 <= s < vocab_size) - set(arr.tolist()))
    if missing:  # special tokens are always kept
        arr = np.array(sorted(set(arr.tolist()) | set(missing)), dtype=np.int64)
    prov = dict(doc.get("provenance") or {})
    prov.setdefault("policy", "calibrated")
    prov["vocab_file"] = str(path)
    if missing:
        prov["specials_added"] = len(missing)
    priors = None
    if doc.get("priors_dir"):
        priors = (path.parent / doc["priors_dir"]).resolve()
        if not priors.is_dir():
            raise ExportError(f"vocab file {path}: priors_dir {doc['priors_dir']!r} does not exist")
    doc = dict(doc, kept_ids=arr.tolist())
    return KeptVocab(arr, prov, doc, priors)


def make_first_k(k: int, drafter_hash: str, vocab_size: int, specials: list[int]) -> KeptVocab:
    ids = first_k(k, vocab_size, specials)
    prov = {"policy": "first-k", "k": k, "specials_kept": len(specials),
            "note": "no calibration data: plain first-K fallback (the lowest K drafter ids, special tokens always kept)"}
    doc = {"format": VOCAB_FORMAT, "format_version": VOCAB_FORMAT_VERSION,
           "tokenizer": {"vocab_hash": drafter_hash, "vocab_size": vocab_size},
           "kept_ids": ids.tolist(), "provenance": prov, "priors_dir": None}
    return KeptVocab(ids, prov, doc, None)


# ----------------------------------------------------------------------------- helpers

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
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(str(hf_dir), use_fast=True)
        tok.save_pretrained(str(dst))
    except Exception as exc:
        raise ExportError(f"{hf_dir} has no tokenizer.json and its tokenizer cannot be converted: {exc}") from exc
    if not (dst / "tokenizer.json").is_file():
        raise ExportError(f"{hf_dir}: no fast tokenizer (tokenizer.json) could be made")


def _dir_bytes(files: dict) -> int:
    return sum(int(f["bytes"]) for f in files.values())


def _estimate_bytes(model_params: int, cached: bool) -> int:
    return 0 if cached else int(model_params) * 4


def _param_estimate(hf_dir: Path) -> int:
    """Bytes of the fp32 weights of an HF directory, from the weight files' sizes."""
    total = 0
    for f in Path(hf_dir).iterdir():
        if f.suffix in (".safetensors", ".bin") and f.is_file():
            total += f.stat().st_size
    return total


def _manifest_files(root: Path) -> dict:
    from edgespec.export.onnx_export import file_digest

    out = {}
    for f in sorted(p for p in root.rglob("*") if p.is_file()):
        rel = f.relative_to(root).as_posix()
        if rel == MANIFEST:
            continue
        out[rel] = {"sha256": file_digest(f), "bytes": f.stat().st_size}
    return out


def _is_enospc(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)


# ----------------------------------------------------------------------------- main entry

def export_bundle(target: str, drafter: str, out: str | Path, keep: int | None = None, vocab: str | Path | None = None,
                  pair: str | None = None, progress: bool = True, cache: Path | None = None,
                  transform: Callable[[Path], dict | None] | None = None, force_external: bool = False,
                  graph: str | None = None, builder: dict | None = None) -> Path:
    """Export a bundle; returns its path. Raises an EdgespecError (nothing written) on failure.

    `graph` is "builder" (onnxruntime-genai's model builder, export/builder.py), "optimum", or None:
    the builder wherever it takes both architectures, else optimum (said in one line). `builder`
    holds the builder's settings: {"target": precision, "drafter": precision, "ep", "accuracy_level",
    "block_size", "quality_tokens"}; `transform` is the optimum path's quantization hook.

    `transform(root)`, if given, runs on the temporary bundle after the export-time checks and before
    hashing (the quantization hook, see export/cli.py); the dict it returns is merged into the manifest."""
    out = Path(out).expanduser().absolute()
    if keep is not None and vocab is not None:
        raise ExportError("give either --keep K or --vocab VOCAB.json, not both")
    if keep is None and vocab is None:
        raise ExportError("give --keep K (first-K fallback) or --vocab VOCAB.json (from edgespec calibrate)")
    validate_keep(keep)
    if graph not in (None, "builder", "optimum"):
        raise ExportError(f"--graph must be builder or optimum, got {graph!r}")
    check_out_dir(out)
    try:
        return _export_bundle(target, drafter, out, keep, vocab, pair, progress, cache, transform, force_external,
                              graph, builder)
    except EdgespecError:
        raise
    except OSError as exc:
        if _is_enospc(exc):
            raise ExportError(f"no space left on device while exporting to {out} ({exc.filename or ''}); "
                              "free some disk space and re-run (nothing was written)") from exc
        raise


def _export_bundle(target: str, drafter: str, out: Path, keep: int | None, vocab: str | Path | None,
                   pair: str | None, progress: bool, cache: Path | None, transform=None,
                   force_external: bool = False, graph: str | None = None, builder: dict | None = None) -> Path:
    from edgespec.export import onnx_export as ox
    from edgespec.export import prune
    from edgespec.export.sources import resolve
    from edgespec.paths import exports_dir

    t_src = resolve(target, progress)
    d_src = resolve(drafter, progress) if drafter != target else t_src
    t_info = ox.model_info(t_src.hf_dir)
    d_info = ox.model_info(d_src.hf_dir)
    validate_keep(keep, d_info["vocab_size"])
    t_tok = tokenizer_info(t_src.hf_dir)
    d_tok = tokenizer_info(d_src.hf_dir)
    if keep is not None:
        kept = make_first_k(keep, d_tok.vocab_hash, d_info["vocab_size"], d_tok.special_ids)
    else:
        kept = load_vocab_file(Path(vocab), d_tok.vocab_hash, d_info["vocab_size"], d_tok.special_ids)

    # Disk space, up front: uncached exports (fp32 ~ the HF weights) + the bundle itself.
    cache_dir = Path(cache) if cache is not None else exports_dir()
    opts = {"external": True} if force_external else None
    t_cached = (cache_dir / ox.export_key(t_src.sha256, opts) / ox.META).is_file()
    d_cached = (cache_dir / ox.export_key(d_src.sha256, opts) / ox.META).is_file()
    t_w, d_w = _param_estimate(t_src.hf_dir), _param_estimate(d_src.hf_dir)
    need_cache = (0 if t_cached else t_w) + (0 if d_cached or d_src is t_src else d_w)
    # Large target data is hard-linked from the cache; the pruned drafter is rewritten.
    need_bundle = d_w + (t_w if t_w < LINK_MIN_BYTES else 0) + 64 * 1024**2
    same_fs = _same_fs(cache_dir, out.parent)
    checks = [(cache_dir, need_cache + (need_bundle if same_fs else 0))]
    if not same_fs:
        checks.append((out.parent, need_bundle))
    for where, need in checks:
        free = free_bytes(where)
        if need > free:
            raise ExportError(f"not enough disk space: the export needs about {need / 1e9:.1f} GB under {where}, "
                              f"{free / 1e9:.1f} GB free")

    if graph is None and builder is None and transform is not None:
        graph = "optimum"            # a library caller's quantization hook is the optimum path's
    kind = choose_graph(graph, t_src.hf_dir, d_src.hf_dir, progress, force_external, (builder or {}).get("unsupported"))
    if kind == "builder":
        t_exp, d_exp, transform = _build_pair(t_src, d_src, builder or {}, cache_dir, progress)
    else:
        if (builder or {}).get("optimum_refuses"):
            raise ExportError(builder["optimum_refuses"])
        t_exp = ox.export_model(t_src.hf_dir, t_src.sha256, t_src.name, cache=cache_dir, progress=progress,
                                force_external=force_external)
        d_exp = t_exp if d_src.sha256 == t_src.sha256 else \
            ox.export_model(d_src.hf_dir, d_src.sha256, d_src.name, cache=cache_dir, progress=progress,
                            force_external=force_external)

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    _chmod_default(tmp)
    try:
        manifest = _write_bundle(tmp, t_src, d_src, t_exp, d_exp, t_info, d_info, t_tok, d_tok, kept, pair,
                                 progress, transform)
        _chmod_default(tmp)
        _swap_into_place(tmp, out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    _log(progress, f"bundle written to {out} (drafter keeps {manifest['vocab']['kept']} tokens; "
                   f"pruned max |diff| {_fmt(manifest['checks']['pruned_vs_full_max_abs_diff'])}, "
                   f"target vs torch {_fmt(manifest['checks']['target_vs_torch_max_abs_diff'])})")
    return out


def choose_graph(graph: str | None, t_dir: Path, d_dir: Path, progress: bool, force_external: bool = False,
                 unsupported: str | None = None) -> str:
    """"builder" or "optimum" for this pair, said in one line."""
    from edgespec.export import builder as eb

    reasons = [r for r in (unsupported, eb.unsupported_reason(t_dir), eb.unsupported_reason(d_dir)) if r]
    if graph == "builder" and reasons:
        raise ExportError(f"--graph builder: {reasons[0]}")
    if graph is None and force_external:
        graph = "optimum"            # the external-data test path is optimum's
    kind = graph or ("optimum" if reasons else "builder")
    why = f" ({reasons[0]})" if graph is None and reasons else ""
    _log(progress, f"graphs: {'onnxruntime-genai model builder (fused, shared KV cache)' if kind == 'builder' else 'optimum'}"
                   f"{why}")
    return kind


def _build_pair(t_src, d_src, opts: dict, cache_dir: Path, progress: bool):
    """Builder graphs for both sides at their precisions; the transform checks a quantized target's
    quality against the fp32 builder graph of the same model."""
    from edgespec.export import builder as eb

    common = {"ep": opts.get("ep", "cpu"), "accuracy_level": opts.get("accuracy_level"),
              "block_size": opts.get("block_size"), "cache": cache_dir, "progress": progress}
    algo = opts.get("algo")
    t_prec, d_prec = opts.get("target", "fp32"), opts.get("drafter", "fp32")
    t_exp = eb.build_model(t_src.hf_dir, t_src.sha256, t_src.name, precision=t_prec, algo=algo, **common)
    d_exp = t_exp if (d_src.sha256, d_prec) == (t_src.sha256, t_prec) else \
        eb.build_model(d_src.hf_dir, d_src.sha256, d_src.name, precision=d_prec, algo=algo, **common)
    quality_tokens = int(opts.get("quality_tokens", 512))
    if t_prec == "fp32" or not quality_tokens or common["ep"] != "cpu":
        return t_exp, d_exp, None
    ref = eb.build_model(t_src.hf_dir, t_src.sha256, t_src.name, precision="fp32", **common)

    def transform(root: Path) -> dict:
        from edgespec.export.quality import quality_check

        _log(progress, f"quality check: {t_prec} target vs fp32 on {quality_tokens} held-out tokens")
        res = quality_check(ref.onnx, root / "target" / "model.onnx", root / "target" / "tokenizer.json",
                            n_tokens=quality_tokens)
        _log(progress, f"quantized target: top-1 agreement {res['top1_agreement']:.3f}, mean overlap "
                       f"{res['mean_overlap']:.3f}")
        return {"target": {"quantization": {"quality": res}}, "checks": {"quantized_target_quality": res}}

    return t_exp, d_exp, transform


def _chmod_default(d: Path) -> None:
    """mkdtemp makes 0700 directories; a bundle gets the usual umask-derived mode."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(d, 0o777 & ~umask)
    for f in d.rglob("*"):
        if f.is_file():
            os.chmod(f, 0o666 & ~umask)


def _same_fs(a: Path, b: Path) -> bool:
    def dev(p: Path) -> int:
        p = p.resolve()
        while not p.exists():
            p = p.parent
        return p.stat().st_dev

    try:
        return dev(a) == dev(b)
    except OSError:
        return False


def _swap_into_place(tmp: Path, out: Path) -> None:
    if out.exists():
        old = out.with_name(f".{out.name}.old-{os.getpid()}")
        os.replace(out, old)
        try:
            os.replace(tmp, out)
        except BaseException:
            os.replace(old, out)
            raise
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, out)


def _write_bundle(root: Path, t_src, d_src, t_exp, d_exp, t_info, d_info, t_tok, d_tok, kept: KeptVocab,
                  pair: str | None, progress: bool, transform=None) -> dict:
    from edgespec.export import onnx_export as ox
    from edgespec.export import prune

    (root / "target").mkdir()
    (root / "drafter").mkdir()
    (root / "vocab").mkdir()
    # target: the cached export as is
    for name in t_exp.files:
        _place(t_exp.dir / name, root / "target" / name)
    _copy_tokenizer(t_src.hf_dir, root / "target")
    _copy_tokenizer(d_src.hf_dir, root / "drafter")

    # vocabulary maps
    from tokenizers import Tokenizer

    t_tokenizer = Tokenizer.from_file(str(root / "target" / "tokenizer.json"))
    d_tokenizer = Tokenizer.from_file(str(root / "drafter" / "tokenizer.json"))
    same_tok = vocab_hash(t_tokenizer) == vocab_hash(d_tokenizer)
    d2t, t2d = build_maps(t_tokenizer, d_tokenizer, t_info["vocab_size"], d_info["vocab_size"])
    d2t, t2d = d2t[: d_info["vocab_size"]], t2d[: t_info["vocab_size"]]
    ids = kept.ids
    index_map = d2t[ids]
    np.save(root / "vocab" / "drafter_to_target.npy", d2t)
    np.save(root / "vocab" / "target_to_drafter.npy", t2d)
    np.save(root / "vocab" / "index_map.npy", index_map)
    np.save(root / "vocab" / "draft_ids.npy", ids)
    (root / "vocab" / "vocab.json").write_text(json.dumps(kept.doc) + "\n", encoding="utf-8")
    priors = _copy_priors(kept, root / "vocab", t_info["vocab_size"], d_info["vocab_size"])

    # pruned drafter
    _log(progress, f"pruning the drafter head to {ids.size} of {d_info['vocab_size']} columns")
    pinfo = prune.prune_head(d_exp.onnx, root / "drafter", ids, index_map)
    for f in (root / "drafter").iterdir():
        if f.name.startswith("model.onnx") and f.name not in ("model.onnx", prune.DATA_NAME):
            f.unlink()
    gc.collect()
    d_graph = d_exp.meta.get("graph") or {}
    if d_graph.get("ep", "cpu") == "cpu" and d_graph.get("precision") != "fp16":
        pruned_diff, const_ok = _check_pruned(d_exp.onnx, root / "drafter" / "model.onnx", ids, index_map,
                                              d_info["vocab_size"])
    else:        # a graph for another EP may not run on the CPU EP here: check the constant outputs in the graph
        pruned_diff, const_ok = None, _constants_in_graph(root / "drafter" / "model.onnx", ids, index_map)
        _log(progress, f"pruned drafter not run: its graph is {d_graph.get('precision')} for {d_graph.get('ep')}")
    if not const_ok:
        raise ExportError("pruned drafter's index_map/draft_ids outputs do not match the kept vocabulary")
    if pruned_diff is not None and not pruned_diff <= PRUNED_TOL:
        raise ExportError(f"pruned drafter logits differ from the full drafter's at kept columns by {pruned_diff:.3g} "
                          f"(> {PRUNED_TOL}); no bundle written")
    t_check, d_check = t_exp.meta["check"], d_exp.meta["check"]
    t_diff, d_diff = t_check["target_vs_torch_max_abs_diff"], d_check["target_vs_torch_max_abs_diff"]
    if not (t_check["ok"] if "ok" in t_check else t_diff <= ox.TORCH_ATOL):
        raise ExportError(f"exported target logits differ from torch by {t_diff:.3g} (tolerance {ox.TORCH_ATOL} + "
                          f"{ox.TORCH_RTOL}*|logit|); no bundle written")

    updates = transform(root) if transform is not None else None

    # Graph statistics: from the export cache / the prune step, unless a transform changed the graphs.
    d_full_stats = d_exp.meta.get("weight_stats") or prune.weight_stats(d_exp.onnx)
    if transform is None:
        t_stats = t_exp.meta.get("weight_stats") or prune.weight_stats(root / "target" / "model.onnx")
        d_stats = pinfo["weight_stats"]
        ios = {"target": t_exp.meta.get("io") or ox.io_names(root / "target" / "model.onnx"), "drafter": pinfo["io"]}
    else:
        t_stats = prune.weight_stats(root / "target" / "model.onnx")
        d_stats = prune.weight_stats(root / "drafter" / "model.onnx")
        ios = {sub: ox.io_names(root / sub / "model.onnx") for sub in ("target", "drafter")}
    files = _manifest_files(root)

    def side(src, exp, info, tok, stats, sub) -> dict:
        return {
            "source": {"spec": src.spec, "kind": src.kind, "name": src.name, "sha256": src.sha256},
            "onnx": f"{sub}/model.onnx", "external_data": (root / sub / prune.DATA_NAME).is_file(),
            "arch": info["arch"], "num_layers": info["num_layers"], "num_heads": info["num_heads"],
            "num_kv_heads": info["num_kv_heads"], "head_dim": info["head_dim"], "hidden_size": info["hidden_size"],
            "vocab_size": info["vocab_size"], "max_position": info["max_position"],
            "tie_word_embeddings": info["tie_word_embeddings"],
            "params": int(exp.meta["params"]), "graph_params": stats["params"],
            "bytes_per_forward": stats["bytes_per_forward"], "dtype": exp.meta.get("dtype", "float32"),
            "quantization": _builder_quantization(exp.meta), "tokenizer": tok.manifest(), "io": ios[sub],
            "graph": exp.meta.get("graph") or {"kind": "optimum", "kv_cache": "copy"},
            "min_forward_tokens": (exp.meta.get("batch_invariance") or {}).get("min_forward_tokens", 1),
            "export_cache_key": exp.dir.name,
        }

    drafter = side(d_src, d_exp, d_info, d_tok, d_stats, "drafter")
    drafter.update({"kept": int(ids.size), "params_pruned": d_stats["params"],
                    "params_full_graph": d_full_stats["params"],
                    "bytes_per_forward_full": d_full_stats["bytes_per_forward"],
                    "head": {k: v for k, v in pinfo.items() if k not in ("external_data", "weight_stats", "io")}})
    manifest = {
        "format": FORMAT, "format_version": FORMAT_VERSION, "edgespec_version": __version__,
        "created_utc": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "pair": pair, "same_tokenizer": bool(same_tok),
        "target": side(t_src, t_exp, t_info, t_tok, t_stats, "target"),
        "drafter": drafter,
        "vocab": {"kept": int(ids.size), "provenance": kept.provenance,
                  "intersection": intersection_size(d2t),
                  "kept_with_target": int((index_map >= 0).sum()),
                  "target_vocab": int(t_info["vocab_size"]), "drafter_vocab": int(d_info["vocab_size"]),
                  "target_tokenizer_size": t_tok.vocab_size, "drafter_tokenizer_size": d_tok.vocab_size,
                  "vocab_file": "vocab/vocab.json", **priors},
        "checks": {"pruned_vs_full_max_abs_diff": pruned_diff, "pruned_tolerance": PRUNED_TOL,
                   "target_vs_torch_max_abs_diff": t_diff,
                   "target_vs_torch": {k: t_check.get(k) for k in ("atol", "rtol", "max_excess_over_rtol", "ok",
                                                                   "torch_logit_absmax")},
                   "drafter_vs_torch_max_abs_diff": d_diff, "drafter_vs_torch_ok": d_check.get("ok"),
                   "constant_outputs_ok": const_ok, "input": t_exp.meta["check"]["input"]},
        "export": {"versions": t_exp.meta.get("versions"), "task": ox.TASK},
        "files": files,
    }
    if updates:
        _deep_merge(manifest, updates)
    tmp_manifest = root / (MANIFEST + ".tmp")
    tmp_manifest.write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp_manifest, root / MANIFEST)
    return manifest


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


def _copy_priors(kept: KeptVocab, dst: Path, v_t: int, v_d: int) -> dict:
    res = {"prior": None, "affinity": None, "randomised": None}
    if kept.priors_dir is None:
        return res
    src = kept.priors_dir
    # The calibrator records the priors' digests in the vocab file: refuse priors that changed since.
    digests = (kept.doc.get("provenance") or {}).get("priors_files") or {}
    if isinstance(digests, dict):
        from edgespec.export.onnx_export import file_digest

        for name, digest in digests.items():
            f = src / name
            if not f.is_file():
                raise ExportError(f"priors file {f} named by the vocab file is missing")
            if file_digest(f) != digest:
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


def _fmt(x) -> str:
    return "not run" if x is None else f"{x:.1e}"


def _constants_in_graph(path: Path, ids: np.ndarray, index_map: np.ndarray) -> bool:
    import onnx
    from onnx import numpy_helper

    m = onnx.load(str(path), load_external_data=False)
    vals = {n.output[0]: numpy_helper.to_array(n.attribute[0].t, base_dir=str(path.parent)) for n in m.graph.node
            if n.op_type == "Constant" and n.output and n.output[0] in ("index_map", "draft_ids")}
    return (len(vals) == 2 and np.array_equal(vals["index_map"], index_map) and np.array_equal(vals["draft_ids"], ids))


def _check_pruned(full: Path, pruned: Path, ids: np.ndarray, index_map: np.ndarray, vocab_size: int) -> tuple[float, bool]:
    from edgespec.export.onnx_export import check_inputs, ort_session, run_prefill_decode

    x = check_inputs(vocab_size, seed=4321)
    sess = ort_session(full)
    ref = run_prefill_decode(sess, x)[..., ids]
    del sess
    gc.collect()
    sess = ort_session(pruned)
    got = run_prefill_decode(sess, x)
    consts = sess.run(["index_map", "draft_ids"], {
        "input_ids": x[:, :1], "attention_mask": np.ones((1, 1), np.int64),
        **({"position_ids": np.zeros((1, 1), np.int64)} if any(i.name == "position_ids" for i in sess.get_inputs()) else {}),
        **{i.name: np.zeros([1, int(i.shape[1]), 0, int(i.shape[3])], np.float32)
           for i in sess.get_inputs() if i.name.startswith("past_key_values.")}})
    del sess
    gc.collect()
    if got.shape != ref.shape:
        raise ExportError(f"pruned drafter logits have shape {got.shape}, expected {ref.shape}")
    ok = bool(np.array_equal(consts[0], index_map) and np.array_equal(consts[1], ids))
    return float(np.max(np.abs(got - ref))), ok
