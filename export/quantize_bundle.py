"""Quantizing the graphs of a bundle being exported: the `edgespec export --quantize*` flags and the
transform that export/bundle_files.py runs on the temporary bundle (see export/cli.py).

For each side asked for, the float graph `SIDE/model.onnx` is quantized into `SIDE/.quant/`, and the
result replaces it (the float target may be hard-linked from the export cache: it is unlinked, never
written through). For the target, the quality check compares the quantized graph with the float one
before the swap. The manifest then records, per side, the scheme and the bytes per forward of the
quantized graph, and the quality check under `checks.quantized_target_quality`.
"""
from __future__ import annotations

import gc
import os
import shutil
from pathlib import Path

from edgespec.errors import ExportError
from edgespec.export import quantize as q
from edgespec.export.graph_info import weight_stats
from edgespec.export.progress import log
from edgespec.export.quality import check_batch_invariance, quality_check

CHOICES = ("none",) + q.SCHEMES + ("fp16",)
# int8 stays on the optimum path: the pinned builder's int8 graph names its head weight *_Q4 but stores
# *_Q8 (ORT refuses to load it; seen with onnxruntime-genai 0.15.2 on SmolLM2).
BUILDER_PRECISION = {"none": "fp32", "int4": "int4", "fp16": "fp16"}
FP16_BUILDER_ONLY = "fp16 graphs come from the model builder only (--graph builder)"


def _schemes(args) -> tuple[str, str]:
    """(target scheme, drafter scheme) from --quantize and its per-side overrides."""
    return args.quantize_target or args.quantize, args.quantize_drafter or args.quantize


def add_arguments(p) -> None:
    g = p.add_argument_group("quantization (ONNX Runtime's own quantizers; see docs/quantization.md)")
    g.add_argument("--quantize", choices=CHOICES, default="none", metavar="SCHEME",
                   help=f"weights of both graphs: {', '.join(CHOICES)} (default none: fp32)")
    g.add_argument("--quantize-target", choices=CHOICES, default=None, metavar="SCHEME",
                   help="override --quantize for the target")
    g.add_argument("--quantize-drafter", choices=CHOICES, default=None, metavar="SCHEME",
                   help="override --quantize for the drafter")
    g.add_argument("--block-size", type=int, choices=q.BLOCK_SIZES, default=q.DEFAULT_BLOCK_SIZE,
                   help=f"the target's quantization block along the input dimension (default {q.DEFAULT_BLOCK_SIZE})")
    g.add_argument("--drafter-block-size", type=int, choices=q.BLOCK_SIZES, default=None,
                   help="the drafter's block (default: the largest of 128, 64, 32 its shapes allow, with RTN where "
                        "k_quant cannot take it: a drafter's numerics never change the output, and larger blocks "
                        "step faster; docs/quantization.md)")
    g.add_argument("--accuracy-level", type=int, choices=q.ACCURACY_LEVELS, default=None,
                   help="MatMulNBits compute type: 0 unset, 1 fp32, 2 fp16, 3 bf16, 4 int8 (default 4 for --ep cpu)")
    g.add_argument("--quantize-embedding", action="store_true",
                   help="int4: also quantize the embedding table (GatherBlockQuantized); smaller files, same bytes "
                        "per forward, some quality loss")
    p.add_argument("--ep", "--quantize-ep", dest="quantize_ep", default="cpu", metavar="EP",
                   help="the EP the bundle is for: cpu (default), cuda, dml, webgpu (docs/quantization.md)")
    g.add_argument("--int4-algo", choices=("rtn", "k_quant", "rtn_last", "k_quant_last", "k_quant_mixed"), default=None,
                   help="builder graphs: onnxruntime's weight-quantization method (default k_quant; rtn is the builder's own default); *_last "
                        "keeps the LM head in int8, k_quant_mixed also the most sensitive layers (docs/fast-path.md)")
    g.add_argument("--quality-tokens", type=int, default=512, metavar="N",
                   help="tokens of the quantized-vs-fp32 target check (0 skips it; default 512)")


def builder_settings(args) -> dict:
    """The model builder's settings from the same flags (export/builder.py). A scheme the builder
    lacks (int8-dynamic) leaves the optimum path to handle or refuse it."""
    target, drafter = _schemes(args)
    out = {"ep": args.quantize_ep, "accuracy_level": args.accuracy_level, "block_size": args.block_size,
           "drafter_block_size": getattr(args, "drafter_block_size", None),
           "quality_tokens": args.quality_tokens, "algo": getattr(args, "int4_algo", None)}
    if args.quality_tokens < 0:
        raise ExportError(f"--quality-tokens must be >= 0, got {args.quality_tokens}")
    for side, scheme in (("target", target), ("drafter", drafter)):
        if scheme not in BUILDER_PRECISION:
            out["unsupported"] = f"{scheme} is not a model-builder precision; use --graph optimum"
            continue
        # a GPU EP's float graph is fp16: ORT has no fp32 GroupQueryAttention kernel on CUDA, so an fp32
        # graph would run attention on the CPU EP (runtime/engine/placement.py)
        out[side] = "fp16" if scheme == "none" and args.quantize_ep != "cpu" else BUILDER_PRECISION[scheme]
        if out[side] == "fp16":
            out["optimum_refuses"] = FP16_BUILDER_ONLY
    return out


def transform_from_args(args):
    gpu_float = args.quantize_ep != "cpu" and "none" in _schemes(args)
    if "fp16" in (args.quantize, args.quantize_target, args.quantize_drafter) or gpu_float:
        if args.graph == "optimum":
            raise ExportError(FP16_BUILDER_ONLY)
        return None          # the builder's precision; the optimum path refuses it in export_bundle
    target, drafter = _schemes(args)
    return make_transform(target, drafter, block_size=args.block_size, accuracy_level=args.accuracy_level,
                          drafter_block_size=getattr(args, "drafter_block_size", None),
                          ep=args.quantize_ep, embedding=args.quantize_embedding,
                          quality_tokens=args.quality_tokens, progress=not getattr(args, "quiet", False))


def make_transform(target: str | None, drafter: str | None, block_size: int = q.DEFAULT_BLOCK_SIZE,
                   accuracy_level: int | None = None, ep: str = "cpu", embedding: bool = False,
                   quality_tokens: int = 512, progress: bool = True, drafter_block_size: int | None = None):
    """The bundle transform for the given schemes (None/"none" leaves a side float), or None if nothing
    is to be quantized. Scheme, EP and accuracy level are validated here, before any export work.
    The drafter's blocks: `drafter_block_size`, else the largest of quantize.DRAFTER_BLOCK_SIZES dividing its shapes."""
    sides = {side: s for side, s in (("target", target), ("drafter", drafter)) if s and s != "none"}
    if not sides:
        return None
    if quality_tokens < 0:
        raise ExportError(f"--quality-tokens must be >= 0, got {quality_tokens}")
    for scheme in sides.values():
        if scheme not in q.SCHEMES:
            raise ExportError(f"unknown quantization scheme {scheme!r}; use one of {', '.join(CHOICES)}")
        q.check_accuracy_level(scheme, accuracy_level)
        q.check_ep(scheme, ep, embedding and scheme == "int4")
    if sides.get("target") == "int8-dynamic":
        raise ExportError("int8-dynamic quantizes activations per tensor over the whole forward, so a k-token verify "
                          "differs from k decode steps and speculative decoding would not be exact; use it for the "
                          "drafter only (--quantize-drafter int8-dynamic), and int4 or int8 for the target")
    for flag, size in (("--block-size", block_size), ("--drafter-block-size", drafter_block_size or block_size)):
        if size not in q.BLOCK_SIZES:
            raise ExportError(f"{flag} must be one of {q.BLOCK_SIZES}, got {size}")
    opts = {"block_size": block_size, "accuracy_level": accuracy_level, "ep": ep, "embedding": embedding}

    def transform(root: Path) -> dict:
        updates: dict = {}
        for side, scheme in sides.items():
            if not (Path(root) / side).is_dir():      # a target-only bundle has no drafter
                continue
            side_opts = opts if side == "target" else {**opts, "block_size": drafter_block_size or "largest"}
            updates[side] = quantize_side(Path(root), side, scheme, side_opts,
                                          quality_tokens if side == "target" else 0, progress)
        if "quality" in updates.get("target", {}).get("quantization", {}):
            updates["checks"] = {"quantized_target_quality": updates["target"]["quantization"]["quality"]}
        return updates

    transform.sides = dict(sides)         # the scheme each side gets
    return transform


def _unlink_shared_data(sub: Path) -> None:
    """Bundle weight files are hard links into the export cache; onnx refuses to load hard-linked
    external data ("potential hardlink attack"), so give the side its own copy before quantizing."""
    for f in sub.glob("*.data"):
        if f.stat().st_nlink > 1:
            tmp = f.with_name(f.name + ".copy")
            shutil.copyfile(f, tmp)
            os.replace(tmp, f)


def quantize_side(root: Path, side: str, scheme: str, opts: dict, quality_tokens: int, progress: bool) -> dict:
    """Quantize ROOT/SIDE/model.onnx in place (via a scratch dir); returns the manifest update for SIDE."""
    sub = root / side
    src = sub / "model.onnx"
    work = sub / ".quant"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    _unlink_shared_data(sub)
    try:
        before = weight_stats(src)
        block = "" if scheme == "int8-dynamic" else \
            " (the largest block its shapes allow)" if opts["block_size"] == "largest" else f" (block {opts['block_size']})"
        log(progress, f"quantizing the {side} to {scheme}{block}")
        record = q.quantize_onnx(src, work / "model.onnx", scheme=scheme, **opts)
        gc.collect()
        if quality_tokens:
            log(progress, f"quality check: {scheme} {side} vs fp32 on {quality_tokens} held-out tokens")
            res = quality_check(src, work / "model.onnx", sub / "tokenizer.json", n_tokens=quality_tokens)
            record["quality"] = res
            level = "" if res["verdict"] == "ok" else " -- DEGRADED: below the acceptability threshold " \
                                                      f"{res['threshold']}"
            log(progress, f"quantized {side}: top-1 agreement {res['top1_agreement']:.3f}, "
                           f"mean overlap {res['mean_overlap']:.3f}{level}")
        if side == "target":
            record["batch_invariance"] = check_batch_invariance(work / "model.onnx", sub / "tokenizer.json", progress)
        _replace_graph(sub, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    after = weight_stats(src)
    record.update({"bytes_per_forward_fp32": before["bytes_per_forward"],
                   "initializer_bytes": after["initializer_bytes"]})
    update = {"quantization": record, "bytes_per_forward": after["bytes_per_forward"], "graph_params": after["params"]}
    if side == "target":
        update["min_forward_tokens"] = record["batch_invariance"]["min_forward_tokens"]
    if side == "drafter":
        update["params_pruned"] = after["params"]
    return update


def _replace_graph(sub: Path, work: Path) -> None:
    """Swap the float graph (and its data, possibly hard links into the export cache) for the quantized one."""
    for name in ("model.onnx", "model.onnx.data"):
        (sub / name).unlink(missing_ok=True)
    for f in work.iterdir():
        os.replace(f, sub / f.name)
