"""Step costs at the real pair's shapes on a GPU EP (benchmarks/gpu_check.py --scale).

Random Qwen2.5-Coder-1.5B- and 0.5B-shaped models are made with transformers on the machine, built with
onnxruntime-genai's model builder for the EP (fp16, then int4), given edgespec's graph metadata
(export/builder.py `_finish_graph`), and timed: edgespec's ModelRunner (shared KV layout) against
onnxruntime-genai's generator on the same graph, interleaved; the cost of a k-token forward, k = 1..9;
the drafter's step with its full head and pruned to 32,768 tokens (export/prune.py); the expected
speedup of the measured costs at acceptance 0.6 / 0.7 / 0.8 (profiler/mbsu.py's tau). Random weights:
acceptance means nothing here. On the CPU EP (`--ep cpu`: fp32 and int4; a many-core host) it also
measures how a target and a drafter step scale with threads, runs edgespec at the counts the device
profile would choose (genai at its own: every core), and prints the plan runtime/planning/plan.py makes from the
measured costs. EDGESPEC_SCALE_SHAPES=tiny shrinks the models for a dry run on a CPU.
"""
from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

QWEN_15B = dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=False)
QWEN_05B = dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True)
TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            vocab_size=4096, tie_word_embeddings=False)
PROMPT, NEW = 64, 128
KEEP = 32768


def _hf_model(shape: dict, out: Path, tokenizer_dir: Path, device: str) -> Path:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(**shape, max_position_embeddings=32768, rope_theta=1e6,
                      bos_token_id=1, eos_token_id=2, pad_token_id=0)
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen2ForCausalLM(cfg).to(torch.float16).eval()
    model.save_pretrained(str(out))
    for f in tokenizer_dir.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens")):
            shutil.copy(f, out / f.name)
    return out


def _build(hf: Path, out: Path, precision: str, ep: str, head_dim: int) -> Path:
    from edgespec.export.builder import _finish_graph

    t0 = time.perf_counter()
    cmd = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(hf), "-o", str(out), "-p", precision,
           "-e", ep, "-c", str(out.parent / f"{out.name}.cache")]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError(f"builder failed: {proc.stderr[-800:]}")
    _finish_graph(out / "model.onnx", head_dim, precision)
    print(f"built {out.name} in {time.perf_counter() - t0:.0f} s", flush=True)
    return out


def _runner(path: Path, ep: str, threads: int | None = None, capture: bool = False):
    """edgespec's runner on `path`; capture: its steps as CUDA graphs (runtime/engine/kv_static.py)."""
    from edgespec.runtime.engine.kv import ModelRunner
    from edgespec.runtime.engine.kv_static import STATIC_LENGTH
    from edgespec.runtime.engine.sessions import create_session, with_graph_capture

    sess, _ = create_session(path, with_graph_capture(ep) if capture else ep, threads=threads, role="target")
    return ModelRunner(sess, "target", static_length=STATIC_LENGTH if capture else None)


def _with_greedy_ids(model_dir: Path) -> Path:
    """model_dir/edgespec.onnx: the graph with its greedy ids (export/greedy_ids.py) beside the same data;
    onnxruntime-genai keeps model.onnx."""
    import onnx

    from edgespec.export.greedy_ids import add_greedy_ids

    model = onnx.load(str(model_dir / "model.onnx"), load_external_data=False)
    add_greedy_ids(model)
    onnx.save_model(model, str(model_dir / "edgespec.onnx"))
    return model_dir / "edgespec.onnx"


def _genai_captured(model_dir: Path, ep: str):
    """onnxruntime-genai's model with its CUDA graphs (provider option enable_cuda_graph)."""
    import onnxruntime_genai as og

    config = og.Config(str(model_dir))
    config.clear_providers()
    config.append_provider(ep)
    config.set_provider_option(ep, "enable_cuda_graph", "1")
    return og.Model(config)


def _thread_choice(target: Path, drafter: Path, ids: list[int]) -> dict:
    """The CPU EP: how a target and a drafter step scale with threads, and the counts the device profile
    would choose (runtime/planning/device_profile.py's own scaling, on these graphs)."""
    from edgespec.runtime.engine.sessions import allowed_cores
    from edgespec.runtime.engine.thread_scaling import probe_step, scale_threads

    cores, prefix = allowed_cores(), 16
    t_ms, t_n = scale_threads(lambda n: probe_step(_runner(target, "cpu", n), ids, prefix), cores)
    d_ms, d_n = scale_threads(lambda n: probe_step(_runner(drafter, "cpu", n), ids, prefix), cores)
    return {"allowed_cores": cores, "os_cpu_count": os.cpu_count(), "target": t_ms, "target_threads": t_n,
            "drafter": d_ms, "drafter_threads": d_n}


def _plan(costs: dict, draft_ms: float, exact_one: bool, threads: dict) -> dict:
    """The plan runtime/planning/plan.py makes from these measured costs (the pair's shapes, random weights)."""
    from edgespec.runtime.planning.device_profile import DeviceProfile, GraphProfile
    from edgespec.runtime.planning.plan import make_plan

    graph = GraphProfile(measured=True, one_token_exact=exact_one, wide_exact=True, cost_ms=[costs[k] for k in sorted(costs)])
    plan = make_plan(DeviceProfile(key={}, graphs={"model": graph}, drafter_step_ms=draft_ms, measure_s=0.0,
                                   measured_utc="-", thread_scaling=threads or None))
    return {"describe": plan.describe(), "reasons": list(plan.reasons), "threads": plan.threads,
            "draft_threads": plan.draft_threads}


def _edgespec_plain(runner, ids: list[int]) -> float:
    """Decode tok/s of greedy 1-token steps after a prefill (the first token excluded)."""
    runner.reset()
    tok = int(np.argmax(runner.forward(ids, last=1)[-1]))
    t0 = time.perf_counter()
    for _ in range(NEW):                  # the graph's own argmax off the CPU EP (ModelRunner.graph_argmax)
        tok = int(runner.forward([tok], pad=False, greedy=True)[-1])
    return NEW / (time.perf_counter() - t0)


def _genai_plain(model, og, ids: list[int]) -> float:
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=len(ids) + NEW + 1, do_sample=False)
    gen = og.Generator(model, params)
    gen.append_tokens(list(ids))
    gen.generate_next_token()
    t0 = time.perf_counter()
    for _ in range(NEW):
        gen.generate_next_token()
    return NEW / (time.perf_counter() - t0)


def _k_costs(runner, ids: list[int], ks=range(1, 10), reps: int = 15) -> dict:
    runner.reset()
    runner.forward(ids, last=1)
    base = runner.length
    out = {}
    for k in ks:
        times = []
        for _ in range(reps + 2):
            t0 = time.perf_counter()
            runner.forward(ids[:k], pad=False)
            times.append((time.perf_counter() - t0) * 1e3)
            runner.crop(base)
        out[k] = round(statistics.median(times[2:]), 3)
    return out


def _graph_costs(path: Path, ks=(1, 2, 3, 4, 5), cap: int = 256, past: int = 64, reps: int = 30,
                 device: str = "cuda") -> dict:
    """ms per forward of k tokens replayed from a captured CUDA graph (ORT's enable_cuda_graph, one graph
    per k through the run option gpu_graph_id): every input and output bound to a fixed device buffer,
    the attention mask at its full length (zeros after the cached positions: GroupQueryAttention's shared
    buffer reads the lengths from its sum), input ids and mask updated in place, the logits copied to the
    host after each replay. Also the max |diff| of the first replay's logits against a plain session's."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    gpu = device == "cuda"          # device="cpu": a dry run of this code on a machine without a GPU
    sess = ort.InferenceSession(str(path), so, providers=[("CUDAExecutionProvider", {"enable_cuda_graph": "1"}),
                                                          "CPUExecutionProvider"] if gpu else ["CPUExecutionProvider"])
    plain = ort.InferenceSession(str(path), so, providers=["CUDAExecutionProvider", "CPUExecutionProvider"] if gpu
                                 else ["CPUExecutionProvider"])
    inputs = {i.name: i for i in sess.get_inputs()}
    names = [n for n in inputs if n.startswith("past_key_values.")]
    shape = inputs[names[0]].shape
    kv_type = np.float16 if inputs[names[0]].type == "tensor(float16)" else np.float32
    logits_out = next(o for o in sess.get_outputs() if o.name == "logits")
    logits_type = np.float16 if logits_out.type == "tensor(float16)" else np.float32
    rng = np.random.default_rng(1)
    host_kv = [(rng.standard_normal((1, int(shape[1]), cap, int(shape[3]))) * 0.1).astype(kv_type) for _ in names]
    out: dict = {}
    for k in ks:
        kv = [ort.OrtValue.ortvalue_from_numpy(h.copy(), device, 0) for h in host_kv]
        ids_host = rng.integers(100, 1000, (1, k)).astype(np.int64)
        mask_host = np.zeros((1, cap), np.int64)
        mask_host[0, :past + k] = 1
        ids, mask = (ort.OrtValue.ortvalue_from_numpy(a, device, 0) for a in (ids_host, mask_host))
        logits = ort.OrtValue.ortvalue_from_shape_and_type([1, k, int(logits_out.shape[-1])], logits_type, device, 0)
        io = sess.io_binding()
        io.bind_ortvalue_input("input_ids", ids)
        io.bind_ortvalue_input("attention_mask", mask)
        for n, v in zip(names, kv):
            io.bind_ortvalue_input(n, v)
            io.bind_ortvalue_output(n.replace("past_key_values.", "present."), v)
        io.bind_ortvalue_output("logits", logits)
        if "logits_to_keep" in inputs:        # 0: every position (export/last_logits.py)
            io.bind_ortvalue_input("logits_to_keep", ort.OrtValue.ortvalue_from_numpy(np.zeros(1, np.int64), device, 0))
        for o in sess.get_outputs():         # the pruned drafter's constant outputs: fixed buffers too
            if o.name != "logits" and not o.name.startswith("present."):
                io.bind_ortvalue_output(o.name, ort.OrtValue.ortvalue_from_shape_and_type(
                    [int(d) for d in o.shape], np.int64, device, 0))
        ro = ort.RunOptions()
        ro.add_run_config_entry("gpu_graph_id", str(k))
        times = []
        for i in range(reps + 3):
            t0 = time.perf_counter()
            ids.update_inplace(ids_host)
            mask.update_inplace(mask_host)
            sess.run_with_iobinding(io, ro)
            got = logits.numpy()
            times.append((time.perf_counter() - t0) * 1e3)
            if i == 0:                     # the plain session on the same inputs (its own copy of the cache)
                io2 = plain.io_binding()
                kv2 = [ort.OrtValue.ortvalue_from_numpy(h.copy(), device, 0) for h in host_kv]
                io2.bind_cpu_input("input_ids", ids_host)
                io2.bind_cpu_input("attention_mask", mask_host)
                if "logits_to_keep" in inputs:
                    io2.bind_cpu_input("logits_to_keep", np.zeros(1, np.int64))
                for n, v in zip(names, kv2):
                    io2.bind_ortvalue_input(n, v)
                    io2.bind_ortvalue_output(n.replace("past_key_values.", "present."), v)
                io2.bind_output("logits")
                plain.run_with_iobinding(io2)
                ref = io2.copy_outputs_to_cpu()[-1]
                out[f"diff_{k}"] = float(np.abs(ref.astype(np.float32) - got.astype(np.float32)).max())
        out[k] = round(statistics.median(times[3:]), 3)
    return out


def _expected(costs: dict, draft_ms: float) -> dict:
    from edgespec.profiler.mbsu import expected_tau

    best = {}
    for alpha in (0.6, 0.7, 0.8):
        rows = [(expected_tau(alpha, g) * costs[1] / (g * draft_ms + costs[g + 1]), g) for g in range(1, 9)
                if g + 1 in costs]
        s, g = max(rows)
        best[str(alpha)] = {"speedup": round(s, 3), "gamma": g}
    return best


def scale(ep: str, out: Path, say, tokenizer_dir: Path) -> None:
    tiny = os.environ.get("EDGESPEC_SCALE_SHAPES") == "tiny"
    device = "cuda" if ep == "cuda" else "cpu"
    work = Path(os.environ.get("EDGESPEC_SCALE_DIR", "/tmp/edgespec-scale"))
    work.mkdir(parents=True, exist_ok=True)
    t_shape = TINY if tiny else QWEN_15B
    d_shape = dict(TINY, tie_word_embeddings=True) if tiny else QWEN_05B
    t_hf = _hf_model(t_shape, work / "t-hf", tokenizer_dir, device)
    d_hf = _hf_model(d_shape, work / "d-hf", tokenizer_dir, device)
    import onnxruntime_genai as og

    rng = np.random.default_rng(0)
    ids = rng.integers(100, t_shape["vocab_size"] - 100, PROMPT).tolist()
    keep = min(KEEP, d_shape["vocab_size"] // 2)
    for precision in ("fp16" if ep != "cpu" else "fp32", "int4"):     # the CPU EP: a dry run
        t0 = time.perf_counter()
        t_dir = _build(t_hf, work / f"t-{precision}", precision, ep, t_shape["hidden_size"] // t_shape["num_attention_heads"])
        d_dir = _build(d_hf, work / f"d-{precision}", precision, ep, d_shape["hidden_size"] // d_shape["num_attention_heads"])
        from edgespec.export.prune import prune_head

        (work / f"d-{precision}-pruned").mkdir(exist_ok=True)
        prune_head(d_dir / "model.onnx", work / f"d-{precision}-pruned", np.arange(keep), np.arange(keep))
        pruned = work / f"d-{precision}-pruned" / "model.onnx"
        threads = _thread_choice(t_dir / "model.onnx", pruned, ids) if ep == "cpu" else {}
        graph = _with_greedy_ids(t_dir)
        target = _runner(graph, ep, threads.get("target_threads"))
        model = og.Model(str(t_dir))                 # genai: its own thread choice (every core)
        rates = {"edgespec": [], "genai": []}
        extra, refused = {}, {}
        if ep == "cuda":                       # both sides' CUDA graphs
            for name, make in (("edgespec_captured", lambda: _runner(graph, ep, capture=True)),
                               ("genai_captured", lambda: _genai_captured(t_dir, ep))):
                try:
                    extra[name] = make()
                    rates[name] = []
                except Exception as exc:  # noqa: BLE001 - a refused capture is a result
                    refused[name] = f"{type(exc).__name__}: {str(exc)[:300]}"
        for _ in range(3):                     # interleaved
            rates["genai"].append(_genai_plain(model, og, ids))
            rates["edgespec"].append(_edgespec_plain(target, ids))
            for name, obj in extra.items():
                rates[name].append(_edgespec_plain(obj, ids) if name.startswith("edgespec") else
                                   _genai_plain(obj, og, ids))
        costs = _k_costs(target, ids)
        drafter = {name: _k_costs(_runner(path / "model.onnx", ep, threads.get("drafter_threads")), ids, ks=(1,))[1]
                   for name, path in (("full", d_dir), ("pruned", work / f"d-{precision}-pruned"))}
        med = {k: statistics.median(v) for k, v in rates.items()}
        graphs = {}
        if ep == "cuda":
            try:
                graphs = {"target": _graph_costs(t_dir / "model.onnx"),
                          "drafter_pruned": _graph_costs(work / f"d-{precision}-pruned" / "model.onnx", ks=(1,))}
                graphs["expected_speedup_vs_plain_graph"] = _expected(graphs["target"], graphs["drafter_pruned"][1])
            except Exception as exc:  # noqa: BLE001 - a measurement: say why it could not be made
                graphs = {"error": f"{type(exc).__name__}: {str(exc)[:400]}"}
        say(f"scale/{precision}", {
            "plain_decode_tok_s": {k: round(v, 1) for k, v in med.items()},
            "edgespec_over_genai": round(med["edgespec"] / med["genai"], 3),
            "captured_edgespec_over_genai": round(med["edgespec_captured"] / med["genai_captured"], 3)
            if "edgespec_captured" in med and "genai_captured" in med else None,
            "capture_refused": refused,
            "captured_steps_checked": sorted(getattr(extra.get("edgespec_captured"), "kv", None).checked)
            if "edgespec_captured" in extra else None,
            "runs": {k: [round(x, 1) for x in v] for k, v in rates.items()},
            "target_k_token_forward_ms": costs, "verify_cost_vs_1": {k: round(v / costs[1], 2) for k, v in costs.items()},
            "drafter_step_ms": drafter, "c_time_pruned": round(drafter["pruned"] / costs[1], 3),
            "expected_speedup_vs_plain": _expected(costs, drafter["pruned"]), "kv_shared": target.shared,
            "cuda_graph_ms": graphs, "min_tokens": target.min_tokens, "threads": threads,
            "plan": _plan(costs, drafter["pruned"], target.min_tokens == 1, threads),
            "seconds": round(time.perf_counter() - t0, 1)})
        del model, target, extra
