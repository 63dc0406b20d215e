"""Fused decoder graphs from onnxruntime-genai's model builder, cached per model and precision.

The builder writes the graph onnxruntime-genai itself runs: GroupQueryAttention with rotary inside,
SkipSimplifiedLayerNormalization, a packed QKV projection and, for int4/int8, MatMulNBits; ~350
nodes for a 28-layer model where optimum's export has ~7,000. Its KV cache can be one buffer shared by
`past_key_values.*` and `present.*` (runtime/engine/kv.py binds it once and never copies it).

`build_model(hf_dir, sha256, precision=...)` runs onnxruntime-genai's builder in a child process
(`python -m edgespec.export.builder_child`, the builder with its memory peak cut and its bytes
unchanged; its log goes to a file; a failure raises ExportError with the log's last line and leaves
nothing in the cache), then loads the torch reference once the child has exited, and:
- names the symbolic head dimension (`kv_cache_dim`) so every consumer sees static KV shapes;
- records in the graph's metadata that the KV cache may be shared (`edgespec.kv_cache = shared`);
- Gemma: replaces the builder's embedding scale, sqrt(hidden_size) rounded to 2 decimals, with the
  exact value transformers uses (`_fix_embed_scale`; the rounding alone made Gemma-3 270M's fp32
  graph miss torch's logits by 0.022 and fail the export check);
- checks the graph against torch on the fixed check input (fp32: judged with optimum's tolerance;
  quantized graphs: recorded only, their quality is judged against the fp32 graph by the caller).

Pin: onnxruntime-genai 0.15.2 is the newest builder that imports with transformers 4.57 (0.16 and
later import transformers 5 classes at import time; optimum-onnx needs transformers < 4.58). On
x86-64 Linux/Windows the `onnxruntime-genai-cuda` wheel is used, because it depends on
onnxruntime-gpu (the plain wheel would pull the CPU `onnxruntime` over it); its CUDA library is
loaded only on demand, so it imports on machines without a GPU (docs/facts.md).
"""
from __future__ import annotations

import gc
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import numpy as np

from edgespec.errors import ExportError
from edgespec.export import onnx_export as ox
from edgespec.export.graph_info import io_names, weight_stats
from edgespec.export.progress import log
from edgespec.export.quality import measure_batch_invariance
from edgespec.export.quantize import DRAFTER_BLOCK_SIZES, dividing_block_sizes
from edgespec.export.workdirs import KEY_RE, fix_modes, owned_tmpdir, remove_stale_tmpdirs
from edgespec.hashing import sha256_file
from edgespec.paths import exports_dir
from edgespec.runtime.engine.kv import KV_KEY

BUILDER_REVISION = 1         # bump when the build recipe changes: invalidates cached builds
PRECISIONS = ("fp32", "fp16", "int4", "int8")
DEFAULT_INT4_ALGO = "k_quant"
BUILDER_EPS = ("cpu", "cuda", "dml", "webgpu")
GRAPH_KEY = "edgespec.graph"
# Text-only causal LMs the pinned builder turns into a decoder graph (builder.py's create_model).
ARCHITECTURES = frozenset({
    "LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "GemmaForCausalLM",
    "Gemma2ForCausalLM", "Gemma3ForCausalLM", "PhiForCausalLM", "Phi3ForCausalLM", "GraniteForCausalLM",
    "OlmoForCausalLM", "NemotronForCausalLM", "SmolLM3ForCausalLM", "Ernie4_5ForCausalLM", "InternLM2ForCausalLM",
})


def builder_version() -> str | None:
    for dist in ("onnxruntime-genai-cuda", "onnxruntime-genai", "onnxruntime-genai-directml"):
        try:
            return version(dist)
        except PackageNotFoundError:
            continue
    return None


def unsupported_reason(hf_dir: Path) -> str | None:
    """Why the builder cannot take this model (None if it can)."""
    cfg = json.loads((Path(hf_dir) / "config.json").read_text())
    arch = (cfg.get("architectures") or ["?"])[0]
    if arch not in ARCHITECTURES:
        return f"the model builder does not take architecture {arch}"
    types = ox.text_config(cfg).get("layer_types")
    if arch == "Gemma3ForCausalLM" and types and \
            [t != "full_attention" for t in types] != [bool((i + 1) % 6) for i in range(len(types))]:
        # builders/gemma.py: Gemma3Model.is_local ignores layer_types (every 6th layer global)
        return "the model builder assumes Gemma-3's every-6th-layer global attention; this model's layer_types differ"
    if builder_version() is None:
        return "onnxruntime-genai (the model builder) is not installed; pip install 'edgespec[export]'"
    return None


def build_path(hf_dir: Path, source_sha256: str, precision: str, ep: str = "cpu", accuracy_level: int | None = None,
               block_size: int | None = None, algo: str | None = None, cache: Path | None = None) -> tuple[Path, dict]:
    """(the cache directory a builder graph of these settings lives in, the builder's quantization options)."""
    options = {}
    if precision in ("int4", "int8"):
        options = {"accuracy_level": accuracy_level if accuracy_level is not None else (4 if ep == "cpu" else 0),
                   "block_size": block_size or 32}
        # k_quant by default: on Qwen2.5-Coder-1.5B it agreed with fp32 on 0.871 of held-out top-1 tokens
        # against RTN's 0.857, at the same step time (docs/fast-path.md, "int4 methods").
        options["algo_config"] = algo or DEFAULT_INT4_ALGO
    cache = Path(cache) if cache is not None else exports_dir()
    return cache / build_key(source_sha256, precision, ep, options, graph_fixes(Path(hf_dir))), options


def drafter_quantization(hf_dir: Path, algo: str | None = None,
                         sizes: tuple[int, ...] = DRAFTER_BLOCK_SIZES) -> tuple[int, str]:
    """(block size, int4 method) for a drafter: the largest of `sizes` that splits every matmul input
    dimension (hidden size, attention output, MLP width) into whole blocks, and `algo` (default k_quant).
    The pinned builder's k_quant packs each row's zero points in whole bytes and fails on an odd block
    count (Qwen2.5-0.5B's 896 in blocks of 128 is 7): where the default k_quant cannot take the larger
    block, RTN takes it. Measured on Qwen2.5-Coder-0.5B (docs/quantization.md): blocks of 128 with RTN
    step 19% faster than k_quant's 32 for 2.1 points less top-1 agreement with the target."""
    cfg = ox.text_config(json.loads((Path(hf_dir) / "config.json").read_text()))
    info = ox.model_info(hf_dir)
    dims = [d for d in (info["hidden_size"], int(info["num_heads"]) * int(info["head_dim"] or 0),
                        int(cfg.get("intermediate_size") or 0)) if d]
    for b in dividing_block_sizes(dims, sizes):
        even = all((d // b) % 2 == 0 for d in dims)
        if algo is None:
            return b, DEFAULT_INT4_ALGO if even else "rtn"
        if even or not algo.startswith("k_quant"):
            return b, algo
    return min(sizes), algo or DEFAULT_INT4_ALGO


def is_built(path: Path) -> bool:
    """Whether a finished builder graph is cached at `path` (build_path's)."""
    return (path / ox.META).is_file() and (path / "model.onnx").is_file()


def build_key(source_sha256: str, precision: str, ep: str, options: dict, fixes: tuple[str, ...] = ()) -> str:
    doc = {"sha256": source_sha256, "graph": "builder", "precision": precision, "ep": ep,
           "options": options, "builder": builder_version(), "revision": BUILDER_REVISION}
    if fixes:                    # only the models a fix applies to get new keys (others keep their caches)
        doc["fixes"] = list(fixes)
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:24]


def graph_fixes(hf_dir: Path) -> tuple[str, ...]:
    """The edits `_finish_graph` makes to this model's builder graph (part of its cache key)."""
    arch = str(ox.model_info(hf_dir).get("arch") or "")
    return (GEMMA_EMBED_SCALE_FIX,) if arch.startswith("gemma") else ()


GEMMA_EMBED_SCALE_FIX = "gemma-embed-scale-1"


def _fix_embed_scale(model, hidden_size: int) -> float | None:
    """The pinned builder scales Gemma's embeddings by sqrt(hidden_size) rounded to 2 decimals
    (builders/gemma.py: 25.3 for 640, not 25.2982; +7.0e-5 relative), where transformers uses
    sqrt(hidden_size) itself. On Gemma-3 270M that alone moved the fp32 logits 0.022 away from
    torch's; with the exact scale they are 4.1e-4 away (torch fp32 vs fp64: 3.9e-4). Sets the
    scalar that multiplies the embedding Gather's output to float32(sqrt(hidden_size)); returns the
    value it replaced (None if there was none)."""
    from onnx import numpy_helper  # lazy: onnx is the [export] extra; `edgespec --help` imports this module

    consts = {n.output[0]: n for n in model.graph.node if n.op_type == "Constant" and n.output}
    gathers = {n.output[0] for n in model.graph.node if n.op_type in ("Gather", "GatherBlockQuantized")   # int4: quantized table
               and len(n.input) > 1 and n.input[1] == "input_ids"}
    exact = np.float32(np.sqrt(hidden_size))
    for n in model.graph.node:
        if n.op_type != "Mul" or not gathers.intersection(n.input):
            continue
        for name in n.input:
            c = consts.get(name)
            if c is None or not c.attribute or c.attribute[0].name != "value":
                continue
            old = numpy_helper.to_array(c.attribute[0].t)
            if old.size == 1 and abs(float(old) - float(exact)) < 0.01:
                c.attribute[0].t.CopyFrom(numpy_helper.from_array(exact.astype(old.dtype).reshape(old.shape),
                                                                  c.attribute[0].t.name))
                return float(old)
    return None


def build_model(hf_dir: Path, source_sha256: str, name: str = "model", precision: str = "fp32", ep: str = "cpu",
                accuracy_level: int | None = None, block_size: int | None = None, algo: str | None = None,
                cache: Path | None = None, progress: bool = True) -> ox.CachedExport:
    """Build (or reuse) the builder graph of an HF causal LM directory at `precision` for `ep`."""
    if precision not in PRECISIONS:
        raise ExportError(f"the model builder has no precision {precision!r}; use one of {', '.join(PRECISIONS)}")
    if ep not in BUILDER_EPS:
        raise ExportError(f"the model builder targets {', '.join(BUILDER_EPS)}, not {ep!r}")
    reason = unsupported_reason(hf_dir)
    if reason:
        raise ExportError(reason)
    cache = Path(cache) if cache is not None else exports_dir()
    final, options = build_path(hf_dir, source_sha256, precision, ep, accuracy_level, block_size, algo, cache)
    remove_stale_tmpdirs(cache, KEY_RE + r"\.tmp-", progress)        # killed builds' leftovers
    remove_stale_tmpdirs(cache, r"\." + KEY_RE + r"\.tmp-", progress, suffix=".builder.log")
    if is_built(final):
        return ox.CachedExport(final, json.loads((final / ox.META).read_text()))
    cache.mkdir(parents=True, exist_ok=True)
    tmp = owned_tmpdir(cache, f"{final.name}.tmp-")
    try:
        meta = _build_into(Path(hf_dir), tmp, name, source_sha256, precision, ep, options, progress)
        if not final.exists():
            os.replace(tmp, final)
        return ox.CachedExport(final, json.loads((final / ox.META).read_text()) if final.exists() else meta)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _run_builder(hf_dir: Path, out: Path, precision: str, ep: str, options: dict) -> float:
    work = out / ".builder-cache"
    cmd = [sys.executable, "-m", "edgespec.export.builder_child", "-i", str(hf_dir), "-o", str(out),
           "-p", precision, "-e", ep, "-c", str(work)]
    if options:
        cmd += ["--extra_options", *[f"{k}={v}" for k, v in options.items()]]
    log_path = out.parent / f".{out.name}.builder.log"
    t0 = time.time()
    env = dict(os.environ, TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    try:
        with open(log_path, "w") as fh:
            rc = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env).returncode
        if rc != 0 or not (out / "model.onnx").is_file():
            lines = [ln.strip() for ln in log_path.read_text(errors="replace").splitlines() if ln.strip()]
            last = lines[-1][:240] if lines else "no output"
            raise ExportError(f"the model builder failed on {hf_dir.name} ({precision}, {ep}; exit {rc}): {last}")
    finally:
        log_path.unlink(missing_ok=True)
        shutil.rmtree(work, ignore_errors=True)
    return time.time() - t0


def _finish_graph(path: Path, head_dim: int, precision: str, fixes: tuple[str, ...] = (),
                  hidden_size: int = 0) -> dict:
    """Static KV head dim, `fixes` (GEMMA_EMBED_SCALE_FIX), edgespec metadata; returns op counts."""
    import onnx  # lazy: onnx and torch are the [export] extra; `edgespec --help` imports this module

    model = onnx.load(str(path), load_external_data=False)
    if GEMMA_EMBED_SCALE_FIX in fixes and _fix_embed_scale(model, hidden_size) is None:
        raise ExportError("the builder's Gemma graph has no embedding-scale constant to correct")
    for vi in [*model.graph.input, *model.graph.output]:
        if vi.name.startswith(("past_key_values.", "present.")):
            dim = vi.type.tensor_type.shape.dim[3]
            if dim.dim_param:
                dim.ClearField("dim_param")
                dim.dim_value = int(head_dim)
    ops: dict[str, int] = {}
    for n in model.graph.node:
        ops[n.op_type] = ops.get(n.op_type, 0) + 1
    meta = {p.key: p.value for p in model.metadata_props}
    meta[GRAPH_KEY] = f"builder/{precision}"
    if ops.get("GroupQueryAttention"):
        meta[KV_KEY] = "shared"
    del model.metadata_props[:]
    for k, v in meta.items():
        model.metadata_props.add(key=k, value=v)
    onnx.save_model(model, str(path))
    return ops


def _build_into(hf_dir: Path, out: Path, name: str, source_sha256: str, precision: str, ep: str, options: dict,
                progress: bool) -> dict:
    info = ox.model_info(hf_dir)
    log(progress, f"building {name} with onnxruntime-genai's model builder ({precision}, {ep}); cached for re-use")
    ids = ox.check_inputs(info["vocab_size"])
    # The builder's child process first, torch's reference after it has exited: the two fp32 copies of
    # the model (7.1 GB each for a 1.5B) never coexist.
    seconds = _run_builder(hf_dir, out, precision, ep, options)
    ref, params = _torch_logits(hf_dir, ids, name)
    for f in list(out.iterdir()):         # keep the graph, its data and the genai config
        if f.name not in ("model.onnx", ox.DATA_NAME, "genai_config.json"):
            f.unlink() if f.is_file() else shutil.rmtree(f)
    fixes = graph_fixes(hf_dir)
    ops = _finish_graph(out / "model.onnx", info["head_dim"], precision, fixes, info["hidden_size"])
    invariance = None
    if precision in ("int4", "int8") and ep == "cpu" and (hf_dir / "tokenizer.json").is_file():
        invariance = measure_batch_invariance(out / "model.onnx", hf_dir / "tokenizer.json", progress)
    check = {"input": {"seed": ox.CHECK_SEED, "prefill": ox.CHECK_PREFILL, "decode": ox.CHECK_DECODE}}
    if ep == "cpu" and precision != "fp16":
        sess = ox.ort_session(out / "model.onnx", prepack=precision in ("int4", "int8"))
        got = ox.run_prefill_decode(sess, ids)
        del sess
        gc.collect()
        check.update(ox.torch_check(got, ref))
        if precision != "fp32":      # quantized weights: recorded, judged by the quality check instead
            check.update({"ok": True, "judged": False})
    else:                            # a graph for another EP may not run on this machine's CPU EP
        check.update({"target_vs_torch_max_abs_diff": None, "ok": True, "judged": False})
    fix_modes(out)
    import onnx  # lazy: onnx is the [export] extra; `edgespec --help` imports this module

    graph = onnx.load(str(out / "model.onnx"), load_external_data=False)
    files = {f.name: {"sha256": sha256_file(f), "bytes": f.stat().st_size} for f in sorted(out.iterdir())}
    meta = {"name": name, "source_sha256": source_sha256, "hf_dir": str(hf_dir), "task": ox.TASK,
            "dtype": "float32" if precision in ("fp32", "int4", "int8") else precision,
            "graph": {"kind": "builder", "builder": f"onnxruntime-genai {builder_version()}", "precision": precision,
                      "ep": ep, "options": options, "fixes": list(fixes), "nodes": int(sum(ops.values())),
                      "group_query_attention": int(ops.get("GroupQueryAttention", 0)),
                      "kv_cache": "shared" if ops.get("GroupQueryAttention") else "copy"},
            "external_data": (out / ox.DATA_NAME).is_file(), "info": info, "params": int(params),
            "io": io_names(graph), "weight_stats": weight_stats(graph), "versions": ox._versions(),
            "revision": BUILDER_REVISION, "export_seconds": round(seconds, 1), "check": check, "batch_invariance": invariance, "files": files}
    (out / ox.META).write_text(json.dumps(meta, indent=2) + "\n")
    diff = check.get("target_vs_torch_max_abs_diff")
    diff = "not run" if diff is None else f"{diff:.2e}"
    log(progress, f"built {name} in {seconds:.0f} s: {meta['graph']['nodes']} nodes, "
                  f"{meta['graph']['group_query_attention']} GroupQueryAttention; ORT vs torch max |diff| {diff}")
    return meta


def _torch_logits(hf_dir: Path, ids, name: str):
    """Reference logits of the HF model on the check input, and its parameter count (torch freed after)."""
    import torch  # lazy: the [export] extra
    from transformers import AutoModelForCausalLM  # lazy: the [export] extra

    torch.set_num_threads(1)  # torch with 2 threads is pathological on these VMs (docs/facts.md)
    try:
        model = AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32).eval()
    except Exception as exc:
        raise ExportError(f"cannot load model {name} from {hf_dir}: {type(exc).__name__}: "
                          f"{str(exc).splitlines()[0][:200]}") from exc
    params = sum(p.numel() for p in model.parameters())
    ref = ox._torch_reference(model, ids)
    del model
    gc.collect()
    return ref, params
