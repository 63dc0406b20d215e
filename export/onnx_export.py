"""Single-model ONNX export through optimum, cached per model under edgespec.paths.exports_dir().

`export_model(source)` exports an HF causal LM (fp32, task text-generation-with-past, one
`model.onnx` with past inputs) to `<cache>/onnx/<key>/`, where key = hash of (source sha256, export
options, library versions, EXPORT_REVISION). A second call with the same inputs reuses it.

Memory: the torch model is loaded once, its reference logits on a fixed random input are computed,
it is exported and then freed *before* ONNX Runtime loads the exported graph for the check, so the
two never coexist (the 1.5B export peaks at ~15 GB inside the TorchScript exporter itself).
Models whose weights exceed ~2 GB get ONNX external data, always named `model.onnx.data`.
"""
from __future__ import annotations

import gc
import hashlib
import json
import logging
import os
import shutil
import time
import warnings
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import numpy as np

from edgespec.errors import ExportError
from edgespec.export.graph_info import all_tensors, io_names, weight_stats
from edgespec.export.progress import log
from edgespec.export.workdirs import KEY_RE, fix_modes, owned_tmpdir, remove_stale_tmpdirs
from edgespec.hashing import sha256_file
from edgespec.paths import exports_dir
from edgespec.runtime.engine.kv import default_feeds
from edgespec.runtime.engine.sessions import session_options

EXPORT_REVISION = 2          # bump when the export recipe changes: invalidates cached exports
TASK = "text-generation-with-past"
DATA_NAME = "model.onnx.data"
META = "edgespec-export.json"
CHECK_SEED = 1234
CHECK_PREFILL = 12
CHECK_DECODE = 4


@dataclass
class CachedExport:
    dir: Path
    meta: dict

    @property
    def onnx(self) -> Path:
        return self.dir / "model.onnx"

    @property
    def external_data(self) -> bool:
        return bool(self.meta.get("external_data"))

    @property
    def files(self) -> dict[str, dict]:
        return self.meta["files"]


def _versions() -> dict:
    """Versions of the export stack, from package metadata (importing torch just for a cache key is slow)."""
    out = {}
    for name in ("torch", "transformers", "optimum", "onnx"):  # (the key of existing caches depends on this set)
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = None
    return out


TORCH_ATOL = 1e-3
TORCH_RTOL = 1e-4


def torch_check(got: np.ndarray, ref: np.ndarray) -> dict:
    """ORT vs torch: max |diff|, and whether |diff| <= atol + rtol*|ref| everywhere (np.allclose's rule)."""
    d = np.abs(got.astype(np.float64) - ref.astype(np.float64))
    excess = float(np.max(d - TORCH_RTOL * np.abs(ref)))
    return {"target_vs_torch_max_abs_diff": float(d.max()), "atol": TORCH_ATOL, "rtol": TORCH_RTOL,
            "max_excess_over_rtol": excess, "ok": bool(excess <= TORCH_ATOL),
            "torch_logit_absmax": float(np.max(np.abs(ref)))}


def export_key(source_sha256: str, options: dict | None = None) -> str:
    blob = json.dumps({"sha256": source_sha256, "task": TASK, "dtype": "float32", "options": options or {},
                       "versions": _versions(), "revision": EXPORT_REVISION}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


def text_config(config: dict) -> dict:
    """The language-model part of an HF config.json (Gemma-3 style configs nest it)."""
    return config.get("text_config") or config


def model_info(hf_dir: Path) -> dict:
    cfg = text_config(json.loads((Path(hf_dir) / "config.json").read_text()))
    heads = int(cfg.get("num_attention_heads", 0) or 0)
    hidden = int(cfg.get("hidden_size", 0) or 0)
    head_dim = cfg.get("head_dim") or (hidden // heads if heads else None)
    return {
        "arch": cfg.get("model_type"),
        "num_layers": cfg.get("num_hidden_layers"),
        "num_heads": heads,
        "num_kv_heads": cfg.get("num_key_value_heads", heads),
        "head_dim": head_dim,
        "hidden_size": hidden,
        "vocab_size": int(cfg["vocab_size"]),
        "max_position": cfg.get("max_position_embeddings"),
        "tie_word_embeddings": bool(cfg.get("tie_word_embeddings", False)),
    }


def check_inputs(vocab_size: int, n: int = CHECK_PREFILL + CHECK_DECODE, seed: int = CHECK_SEED) -> np.ndarray:
    """The fixed random input ids used by every export-time check."""
    return np.random.default_rng(seed).integers(0, vocab_size, size=(1, n), dtype=np.int64)


def ort_session(path: Path, threads: int = 1, prepack: bool = False):
    """A CPU session for the export-time checks: the runtime's thread policy. Prepacking is off unless
    asked, so that fp32 weights are held once; quantized graphs ask for it: MatMulNBits without its
    packed weights takes a path about 60x slower (49 s against 0.8 s for the 1.5B's 16 check tokens)
    and other than the runtime's."""
    import onnxruntime as ort  # lazy: `edgespec --help` imports this module; torch, onnx and ORT load on use

    so = session_options(threads)
    if not prepack:
        so.add_session_config_entry("session.disable_prepacking", "1")
    return ort.InferenceSession(str(path), sess_options=so, providers=["CPUExecutionProvider"])


def run_prefill_decode(sess, ids: np.ndarray, prefill: int = CHECK_PREFILL, outputs: list[str] | None = None) -> np.ndarray:
    """Logits [1, n, V] for `ids` computed by an ORT session: a prefill of `prefill` tokens with
    past length 0, then one token at a time through the KV cache."""
    inputs = {i.name: i for i in sess.get_inputs()}
    past_names = [n for n in inputs if n.startswith("past_key_values.")]
    out_names = [o.name for o in sess.get_outputs()]
    present_names = [n for n in out_names if n.startswith("present.")]

    def empty(name):
        shape = inputs[name].shape  # [batch, kv_heads, past, head_dim]
        dims = [1, int(shape[1]), 0, int(shape[3])]
        return np.zeros(dims, dtype=np.float16 if inputs[name].type == "tensor(float16)" else np.float32)

    past = {n: empty(n) for n in past_names}
    logits = []
    pos = 0
    steps = [ids[:, :prefill]] + [ids[:, i:i + 1] for i in range(prefill, ids.shape[1])]
    for chunk in steps:
        s = chunk.shape[1]
        feed = {"input_ids": chunk, "attention_mask": np.ones((1, pos + s), dtype=np.int64)}
        if "position_ids" in inputs:
            feed["position_ids"] = np.arange(pos, pos + s, dtype=np.int64)[None, :]
        feed.update(past)
        res = dict(zip(out_names, sess.run(out_names, {**feed, **default_feeds(sess)})))
        logits.append(res["logits"].astype(np.float32))
        past = {p.replace("present.", "past_key_values."): res[p] for p in present_names}
        pos += s
    return np.concatenate(logits, axis=1)


def _torch_reference(model, ids: np.ndarray) -> np.ndarray:
    import torch  # lazy: the [export] extra

    with torch.no_grad():
        out = model(input_ids=torch.from_numpy(ids), use_cache=False)
    return out.logits.float().numpy()


def _normalise_external_data(out_dir: Path) -> bool:
    """Rename optimum's external data file(s) to model.onnx.data; True if the model has external data."""
    import onnx  # lazy: onnx is the [export] extra

    path = out_dir / "model.onnx"
    model = onnx.load(str(path), load_external_data=False)
    locations = set()
    for t in all_tensors(model):
        if t.data_location == onnx.TensorProto.EXTERNAL:
            for e in t.external_data:
                if e.key == "location":
                    locations.add(e.value)
    if not locations:
        return False
    if locations == {DATA_NAME}:
        return True
    if len(locations) != 1:
        # Several data files (one per tensor): fold them into one through onnx's own writer.
        model = onnx.load(str(path), load_external_data=True)
        for loc in locations:
            (out_dir / loc).unlink(missing_ok=True)
        onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                        location=DATA_NAME, size_threshold=1024)
        return True
    (loc,) = locations
    os.replace(out_dir / loc, out_dir / DATA_NAME)
    for t in all_tensors(model):
        for e in t.external_data:
            if e.key == "location":
                e.value = DATA_NAME
    onnx.save_model(model, str(path))
    return True


def export_model(hf_dir: Path, source_sha256: str, name: str = "model", cache: Path | None = None,
                 progress: bool = True, force_external: bool = False) -> CachedExport:
    """Export (or reuse) the ONNX graph of an HF causal LM directory.

    `force_external` stores the weights as external data even below 2 GB (tests use it to exercise
    the path the 1.5B takes)."""
    cache = Path(cache) if cache is not None else exports_dir()
    key = export_key(source_sha256, {"external": True} if force_external else None)
    final = cache / key
    remove_stale_tmpdirs(cache, KEY_RE + r"\.tmp-", progress)     # on a cache hit too: the next export cleans up
    if (final / META).is_file() and (final / "model.onnx").is_file():
        return CachedExport(final, json.loads((final / META).read_text()))
    cache.mkdir(parents=True, exist_ok=True)
    tmp = owned_tmpdir(cache, f"{key}.tmp-")
    try:
        _export_into(Path(hf_dir), tmp, name, source_sha256, progress, force_external)
        meta = json.loads((tmp / META).read_text())
        if final.exists():  # a concurrent export finished first
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            os.replace(tmp, final)
        return CachedExport(final, json.loads((final / META).read_text()) if final.exists() else meta)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _export_into(hf_dir: Path, out: Path, name: str, source_sha256: str, progress: bool,
                 force_external: bool = False) -> None:
    import onnx  # lazy: onnx is the [export] extra
    import torch  # lazy: the [export] extra
    from optimum.exporters.onnx import onnx_export_from_model  # lazy: the [export] extra
    from transformers import AutoModelForCausalLM  # lazy: the [export] extra

    torch.set_num_threads(1)  # torch with 2 threads is pathological on these VMs (docs/facts.md)
    info = model_info(hf_dir)
    t0 = time.time()
    log(progress, f"exporting {name} to ONNX (fp32, {TASK}); cached for re-use")
    try:
        model = AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32)
    except Exception as exc:
        raise ExportError(f"cannot load model {name} from {hf_dir}: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}") from exc
    model.eval()
    params = sum(p.numel() for p in model.parameters())
    ids = check_inputs(info["vocab_size"])
    ref = _torch_reference(model, ids)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for lg in ("optimum", "transformers", "torch.onnx"):
            logging.getLogger(lg).setLevel(logging.ERROR)
        try:
            onnx_export_from_model(model, out, task=TASK, do_validation=False, no_post_process=True)
        except OSError:
            raise
        except Exception as exc:
            raise ExportError(f"optimum could not export {name}: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}") from exc
    del model
    gc.collect()
    export_s = time.time() - t0
    external = _normalise_external_data(out)
    if force_external and not external:
        m = onnx.load(str(out / "model.onnx"))
        onnx.save_model(m, str(out / "model.onnx"), save_as_external_data=True, all_tensors_to_one_file=True,
                        location="model.onnx_data", size_threshold=1024)
        del m
        external = _normalise_external_data(out)
    # Keep only the graph and its data; the HF config copies optimum writes are not needed.
    for f in out.iterdir():
        if f.name not in {"model.onnx", DATA_NAME}:
            f.unlink() if f.is_file() else shutil.rmtree(f)
    sess = ort_session(out / "model.onnx")
    got = run_prefill_decode(sess, ids)
    del sess
    gc.collect()
    check = torch_check(got, ref)
    diff = check["target_vs_torch_max_abs_diff"]
    fix_modes(out)
    files = {f.name: {"sha256": sha256_file(f), "bytes": f.stat().st_size} for f in sorted(out.iterdir())}
    graph = onnx.load(str(out / "model.onnx"), load_external_data=False)
    meta = {"name": name, "source_sha256": source_sha256, "hf_dir": str(hf_dir), "task": TASK, "dtype": "float32",
            "external_data": external, "info": info, "params": int(params), "io": io_names(graph),
            "weight_stats": weight_stats(graph),
            "versions": _versions(), "revision": EXPORT_REVISION, "export_seconds": round(export_s, 1),
            "check": {"input": {"seed": CHECK_SEED, "prefill": CHECK_PREFILL, "decode": CHECK_DECODE}, **check},
            "files": files}
    (out / META).write_text(json.dumps(meta, indent=2) + "\n")
    log(progress, f"exported {name} in {export_s:.0f} s (external data: {external}); ORT vs torch max |diff| {diff:.2e}")
