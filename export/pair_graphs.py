"""The two graphs of a bundle: the model builder's (export/builder.py) wherever it takes both
architectures, else optimum's (export/onnx_export.py); both cached. A quantized builder target comes
with a transform that checks its quality against the fp32 builder graph of the same model."""
from __future__ import annotations

from pathlib import Path
from typing import Callable

from edgespec.errors import ExportError
from edgespec.export import builder as eb
from edgespec.export import onnx_export as ox
from edgespec.export.onnx_export import CachedExport
from edgespec.export.progress import log
from edgespec.export.quality import quality_check, require_exact_target
from edgespec.export.quantize import DRAFTER_BLOCK_SIZES
from edgespec.models.weights import ModelSource

Transform = Callable[[Path], dict | None]
# A builder graph's size as a share of the model's fp32 weight files, an upper bound for the disk check
# (measured: Qwen2.5-Coder int4 0.25 (1.5B) and 0.30 (0.5B, its larger embedding share); fp16 half).
GRAPH_SHARE = {"fp32": 1.0, "fp16": 0.5, "int8": 0.45, "int4": 0.35}


def choose_pair_graph(t_src: ModelSource, d_src: ModelSource, graph: str | None, builder: dict | None,
                      transform: Transform | None, progress: bool, force_external: bool = False) -> str:
    """The pair's graph kind, "builder" or "optimum" (choose_graph, said in one line), for `graph` =
    "builder", "optimum" or None (choose); a library caller's quantization hook alone means optimum."""
    if graph is None and builder is None and transform is not None:
        graph = "optimum"
    return choose_graph(graph, t_src.hf_dir, d_src.hf_dir, progress, force_external, (builder or {}).get("unsupported"))


def make_graphs(t_src: ModelSource, d_src: ModelSource, kind: str, builder: dict | None,
                transform: Transform | None, cache_dir: Path, progress: bool,
                force_external: bool = False) -> tuple[CachedExport, CachedExport, Transform | None]:
    """(target graph, drafter graph, the transform to run on the bundle) of `kind` (choose_pair_graph's);
    `builder` holds the builder's settings (export_bundle's docstring)."""
    if kind == "builder":
        return build_pair(t_src, d_src, builder or {}, cache_dir, progress)
    if (builder or {}).get("optimum_refuses"):
        raise ExportError(builder["optimum_refuses"])
    t_exp = ox.export_model(t_src.hf_dir, t_src.sha256, t_src.name, cache=cache_dir, progress=progress,
                            force_external=force_external)
    d_exp = t_exp if d_src.sha256 == t_src.sha256 else \
        ox.export_model(d_src.hf_dir, d_src.sha256, d_src.name, cache=cache_dir, progress=progress,
                        force_external=force_external)
    return t_exp, d_exp, transform


def choose_graph(graph: str | None, t_dir: Path, d_dir: Path, progress: bool, force_external: bool = False,
                 unsupported: str | None = None) -> str:
    """"builder" or "optimum" for this pair, said in one line."""
    reasons = [r for r in (unsupported, eb.unsupported_reason(t_dir), eb.unsupported_reason(d_dir)) if r]
    if graph == "builder" and reasons:
        raise ExportError(f"--graph builder: {reasons[0]}")
    if graph is None and force_external:
        graph = "optimum"            # the external-data test path is optimum's
    kind = graph or ("optimum" if reasons else "builder")
    why = f" ({reasons[0]})" if graph is None and reasons else ""
    log(progress, f"graphs: {'onnxruntime-genai model builder (fused, shared KV cache)' if kind == 'builder' else 'optimum'}"
                   f"{why}")
    return kind


def _builder_plan(opts: dict, cache_dir: Path) -> tuple[dict, str, str, int]:
    """build_pair's settings from `opts`: (build_model's common keywords, target precision, drafter
    precision, the quality check's token count: 0 where no fp32 reference is built)."""
    common = {"ep": opts.get("ep", "cpu"), "accuracy_level": opts.get("accuracy_level"),
              "block_size": opts.get("block_size"), "algo": opts.get("algo"), "cache": cache_dir}
    t_prec, d_prec = opts.get("target", "fp32"), opts.get("drafter", "fp32")
    quality_tokens = int(opts.get("quality_tokens", 512))
    if t_prec == "fp32" or common["ep"] != "cpu":
        quality_tokens = 0
    return common, t_prec, d_prec, quality_tokens


def drafter_options(d_src: ModelSource, d_prec: str, opts: dict) -> dict:
    """The drafter graph's int4 block and method: `drafter_block_size` if given, else the largest its
    shapes allow (builder.drafter_quantization); nothing to change for float graphs."""
    if d_prec not in ("int4", "int8"):
        return {}
    sizes = (opts["drafter_block_size"],) if opts.get("drafter_block_size") else DRAFTER_BLOCK_SIZES
    block, algo = eb.drafter_quantization(d_src.hf_dir, opts.get("algo"), sizes)
    return {"block_size": block, "algo": algo}


def builder_disk_need(t_src: ModelSource, d_src: ModelSource, opts: dict, cache_dir: Path,
                      weight_bytes) -> tuple[int, int, int]:
    """(bytes the builder graphs not cached yet will write into the cache, the target graph's bytes, the
    drafter graph's bytes), from `weight_bytes(hf_dir)` (the fp32 weight files) and GRAPH_SHARE; the
    quality check's fp32 reference counts where build_pair builds it."""
    common, t_prec, d_prec, quality_tokens = _builder_plan(opts, cache_dir)
    d_opts = tuple(drafter_options(d_src, d_prec, opts).items())
    graphs = {(t_src.hf_dir, t_src.sha256, t_prec, ()), (d_src.hf_dir, d_src.sha256, d_prec, d_opts)}
    if quality_tokens:
        graphs.add((t_src.hf_dir, t_src.sha256, "fp32", ()))

    def size(hf_dir, prec) -> int:
        return int(weight_bytes(hf_dir) * GRAPH_SHARE.get(prec, 1.0))

    need = sum(size(d, prec) for d, sha, prec, extra in graphs
               if not eb.is_built(eb.build_path(d, sha, prec, **{**common, **dict(extra)})[0]))
    return need, size(t_src.hf_dir, t_prec), size(d_src.hf_dir, d_prec)


def build_pair(t_src: ModelSource, d_src: ModelSource, opts: dict, cache_dir: Path, progress: bool):
    """Builder graphs for both sides at their precisions; the transform checks a quantized target's
    quality against the fp32 builder graph of the same model."""
    common, t_prec, d_prec, quality_tokens = _builder_plan(opts, cache_dir)
    d_common = {**common, **drafter_options(d_src, d_prec, opts)}
    same = eb.build_path(t_src.hf_dir, t_src.sha256, t_prec, **common) == \
        eb.build_path(d_src.hf_dir, d_src.sha256, d_prec, **d_common)
    t_exp = eb.build_model(t_src.hf_dir, t_src.sha256, t_src.name, precision=t_prec, progress=progress, **common)
    require_exact_target(t_exp.meta.get("batch_invariance"), progress)
    d_exp = t_exp if same else \
        eb.build_model(d_src.hf_dir, d_src.sha256, d_src.name, precision=d_prec, progress=progress, **d_common)
    if not quality_tokens:
        return t_exp, d_exp, None
    ref = eb.build_model(t_src.hf_dir, t_src.sha256, t_src.name, precision="fp32", progress=progress, **common)

    def transform(root: Path) -> dict:
        log(progress, f"quality check: {t_prec} target vs fp32 on {quality_tokens} held-out tokens")
        res = quality_check(ref.onnx, root / "target" / "model.onnx", root / "target" / "tokenizer.json",
                            n_tokens=quality_tokens)
        log(progress, f"quantized target: top-1 agreement {res['top1_agreement']:.3f}, mean overlap "
                       f"{res['mean_overlap']:.3f}")
        return {"target": {"quantization": {"quality": res}}, "checks": {"quantized_target_quality": res}}

    return t_exp, d_exp, transform
