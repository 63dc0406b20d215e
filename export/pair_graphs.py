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
from edgespec.export.quality import quality_check
from edgespec.models.weights import ModelSource

Transform = Callable[[Path], dict | None]


def make_graphs(t_src: ModelSource, d_src: ModelSource, graph: str | None, builder: dict | None,
                transform: Transform | None, cache_dir: Path, progress: bool,
                force_external: bool = False) -> tuple[CachedExport, CachedExport, Transform | None]:
    """(target graph, drafter graph, the transform to run on the bundle) for `graph` = "builder",
    "optimum" or None (choose); `builder` holds the builder's settings (export_bundle's docstring)."""
    if graph is None and builder is None and transform is not None:
        graph = "optimum"            # a library caller's quantization hook is the optimum path's
    kind = choose_graph(graph, t_src.hf_dir, d_src.hf_dir, progress, force_external, (builder or {}).get("unsupported"))
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


def build_pair(t_src: ModelSource, d_src: ModelSource, opts: dict, cache_dir: Path, progress: bool):
    """Builder graphs for both sides at their precisions; the transform checks a quantized target's
    quality against the fp32 builder graph of the same model."""
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
        log(progress, f"quality check: {t_prec} target vs fp32 on {quality_tokens} held-out tokens")
        res = quality_check(ref.onnx, root / "target" / "model.onnx", root / "target" / "tokenizer.json",
                            n_tokens=quality_tokens)
        log(progress, f"quantized target: top-1 agreement {res['top1_agreement']:.3f}, mean overlap "
                       f"{res['mean_overlap']:.3f}")
        return {"target": {"quantization": {"quality": res}}, "checks": {"quantized_target_quality": res}}

    return t_exp, d_exp, transform
