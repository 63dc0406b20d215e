"""`export_bundle`: target + pruned drafter -> an ONNX bundle (see docs/architecture.md).

The bundle is written into a temporary sibling directory and renamed into place only when
complete, so a failed or interrupted export leaves no half-written bundle. That directory's name
records its owner process (`.OUT.tmp-<pid>.<host>-*`); a killed export cannot remove it, so the next
export to OUT removes those whose owner is gone (`remove_stale_leftovers`). An existing output
directory is replaced only if it is an edgespec bundle (or empty). The graphs come from
export/pair_graphs.py; export/bundle_files.py writes the contents.
"""
from __future__ import annotations

import errno
import os
import re
import shutil
from pathlib import Path
from typing import Callable

from edgespec.errors import EdgespecError, ExportError
from edgespec.export import onnx_export as ox
from edgespec.export.bundle_files import LINK_MIN_BYTES, BundleParts, Side, write_bundle
from edgespec.export.kept_vocab import load_vocab_file, make_first_k, validate_keep
from edgespec.export.pair_graphs import builder_disk_need, choose_pair_graph, make_graphs
from edgespec.export.progress import log
from edgespec.export.sources import resolve
from edgespec.export.workdirs import host_tag, owned_tmpdir, remove_stale_tmpdirs
from edgespec.paths import exports_dir
from edgespec.runtime.bundle.manifest import is_bundle_dir
from edgespec.runtime.bundle.vocab import tokenizer_info


def free_bytes(path: Path) -> int:
    """Free bytes on the filesystem holding `path` (the nearest existing parent). Tests monkeypatch this."""
    p = Path(path).resolve()
    while not p.exists():
        p = p.parent
    return shutil.disk_usage(p).free


def check_out_dir(out: Path) -> None:
    out = Path(out)
    if out.exists():
        if not out.is_dir():
            raise ExportError(f"output {out} exists and is not a directory")
        if any(out.iterdir()) and not is_bundle_dir(out):
            raise ExportError(f"output dir {out} exists and is not an edgespec bundle; refusing to overwrite it")


def export_bundle(target: str, drafter: str | None, out: str | Path, keep: int | None = None, vocab: str | Path | None = None,
                  pair: str | None = None, progress: bool = True, cache: Path | None = None,
                  transform: Callable[[Path], dict | None] | None = None, force_external: bool = False,
                  graph: str | None = None, builder: dict | None = None) -> Path:
    """Export a bundle; returns its path. Raises an EdgespecError (nothing written) on failure.

    `graph` is "builder" (onnxruntime-genai's model builder, export/builder.py), "optimum", or None:
    the builder wherever it takes both architectures, else optimum (said in one line). `builder`
    holds the builder's settings: {"target": precision, "drafter": precision, "ep", "accuracy_level",
    "block_size", "drafter_block_size" (None: pair_graphs.drafter_options), "quality_tokens"};
    `transform` is the optimum path's quantization hook.

    `transform(root)`, if given, runs on the temporary bundle after the export-time checks and before
    hashing (the quantization hook, see export/cli.py); the dict it returns is merged into the manifest."""
    out = Path(out).expanduser().absolute()
    if drafter is None and (keep is not None or vocab is not None):
        raise ExportError("--keep/--vocab prune a drafter: a target-only bundle (no --drafter) takes neither")
    if drafter is None:
        pass                          # target only: `ar` and prompt lookup (`ngram`)
    elif keep is not None and vocab is not None:
        raise ExportError("give either --keep K or --vocab VOCAB.json, not both")
    elif keep is None and vocab is None:
        raise ExportError("give --keep K (first-K fallback) or --vocab VOCAB.json (from edgespec calibrate)")
    validate_keep(keep)
    if graph not in (None, "builder", "optimum"):
        raise ExportError(f"--graph must be builder or optimum, got {graph!r}")
    check_out_dir(out)
    remove_stale_leftovers(out, progress)
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
    t_src = resolve(target, progress)
    d_src = resolve(drafter, progress) if drafter not in (None, target) else t_src
    t_info = ox.model_info(t_src.hf_dir)
    t_tok = tokenizer_info(t_src.hf_dir)
    if drafter is None:
        kept = None
        builder = builder and {**builder, "drafter": builder.get("target", "fp32"),       # reuse the target graph
                               "drafter_block_size": builder.get("block_size") or 32}
    else:
        d_info = ox.model_info(d_src.hf_dir)
        validate_keep(keep, d_info["vocab_size"])
        d_tok = tokenizer_info(d_src.hf_dir)
        if keep is not None:
            kept = make_first_k(keep, d_tok.vocab_hash, d_info["vocab_size"], d_tok.special_ids)
        else:
            kept = load_vocab_file(Path(vocab), d_tok.vocab_hash, d_info["vocab_size"], d_tok.special_ids)

    cache_dir = Path(cache) if cache is not None else exports_dir()
    kind = choose_pair_graph(t_src, d_src, graph, builder, transform, progress, force_external)
    _check_disk_space(t_src, d_src, cache_dir, out, force_external, kind, builder)
    t_exp, d_exp, transform = make_graphs(t_src, d_src, kind, builder, transform, cache_dir, progress, force_external)

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = owned_tmpdir(out.parent, f".{out.name}.tmp-")
    _chmod_default(tmp)
    parts = BundleParts(target=Side(t_src, t_exp, t_info, t_tok),
                        drafter=None if drafter is None else Side(d_src, d_exp, d_info, d_tok),
                        kept=kept, pair=pair, progress=progress, transform=transform)
    try:
        manifest = write_bundle(tmp, parts)
        _chmod_default(tmp)
        _swap_into_place(tmp, out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    if drafter is None:
        log(progress, f"target-only bundle written to {out} (strategies ar and ngram; target vs torch "
                       f"{_fmt(manifest['checks']['target_vs_torch_max_abs_diff'])})")
        return out
    log(progress, f"bundle written to {out} (drafter keeps {manifest['vocab']['kept']} tokens; "
                   f"pruned max |diff| {_fmt(manifest['checks']['pruned_vs_full_max_abs_diff'])}, "
                   f"target vs torch {_fmt(manifest['checks']['target_vs_torch_max_abs_diff'])})")
    return out


def _check_disk_space(t_src, d_src, cache_dir: Path, out: Path, force_external: bool, kind: str = "optimum",
                      builder: dict | None = None) -> None:
    """Up front: the graphs not cached yet (optimum fp32 ~ the HF weights; builder graphs at their
    precision's share of them, plus the quality check's fp32 reference) + the bundle itself."""
    if kind == "builder":
        need_cache, t_w, d_w = builder_disk_need(t_src, d_src, builder or {}, cache_dir, _param_estimate)
    else:
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


def _param_estimate(hf_dir: Path) -> int:
    """Bytes of the fp32 weights of an HF directory, from the weight files' sizes."""
    total = 0
    for f in Path(hf_dir).iterdir():
        if f.suffix in (".safetensors", ".bin") and f.is_file():
            total += f.stat().st_size
    return total


def _is_enospc(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)


def _fmt(x) -> str:
    return "not run" if x is None else f"{x:.1e}"


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


def remove_stale_leftovers(out: Path, progress: bool = False) -> list[Path]:
    """Remove what killed exports to `out` left beside it: `.OUT.tmp-*` directories whose owner process
    is gone (workdirs.is_stale), and, once `out` exists again, `.OUT.old-*` (a replaced bundle the
    swap did not get to delete; while `out` is missing it may be the only copy, so it stays)."""
    removed = remove_stale_tmpdirs(out.parent, re.escape(f".{out.name}.tmp-"), progress)
    if out.is_dir():
        removed += remove_stale_tmpdirs(out.parent, re.escape(f".{out.name}.old-"), progress)
    return removed


def _swap_into_place(tmp: Path, out: Path) -> None:
    if out.exists():
        old = out.with_name(f".{out.name}.old-{os.getpid()}.{host_tag()}-{os.urandom(4).hex()}")
        os.replace(out, old)
        try:
            os.replace(tmp, out)
        except BaseException:
            os.replace(old, out)
            raise
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, out)
