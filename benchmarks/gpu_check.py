"""The CUDA execution provider, checked in one run on a GPU machine (docs/gpu.md says how to get one ready).

    python benchmarks/gpu_check.py make DIR                 # tiny bundles, on any machine (export extra)
    python benchmarks/gpu_check.py run DIR OUT [--ep cuda] [--scale]

`make` writes, from the tests' tiny random Llama (tests/tinymodels.py), the bundles the checks use:
cpu-fp32 and cpu-int4 (exported for the CPU EP), cuda-fp16-same, cuda-fp16-hetero and cuda-int4
(`edgespec export --ep cuda`). `run` checks on `--ep`, printing a line per check and writing
OUT/gpu_check.json:
1. placement: which EP runs each target's attention, the KV layout the runner chose and what it said;
2. the CPU EP's greedy tokens against the EP's, 4 prompts x 32 tokens (a divergence where the CPU's
   top-2 logits are within 1e-3 is a near-tie, counted apart);
3. every strategy's greedy output against `ar`'s on the EP, on every bundle;
4. batch invariance on the EP: a position's logits as a 1-token step, inside a 2- and a 4-token forward;
5. sampling: chi-square tests of tli at temperature 1 against the target's own distribution on the EP,
   and a broken verifier that must fail them;
6. `edgespec bench --ep EP --peers` on cuda-fp16-same (report with MBSU, c_time, realisation);
7. CUDA graphs and the graph's greedy ids (benchmarks/gpu_graphs.py): the Memcpy nodes ORT leaves in
   each target graph, captured against uncaptured greedy output for every strategy, and plain decoding
   captured and not against onnxruntime-genai's generator with and without its CUDA graphs;
8. --scale: random Qwen2.5-1.5B- and 0.5B-shaped models built on the machine (transformers + the model
   builder, fp16 and int4 for the EP), step costs for k = 1..9 tokens, the drafter's step full and pruned
   to 32,768 tokens, and plain decoding of edgespec's runner against onnxruntime-genai's generator on
   the same graph, interleaved. Random weights: step costs only, no acceptance.
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
import traceback
import warnings
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
PROMPTS = ["def quicksort(items):", "The capital of France is", "Once upon a time, in a small village,",
           "import numpy as np\n\ndef mean(x):"]
STRATEGIES = ["auto", "ngram", "ngram-tli", "tli", "sd", "rdk-taylor", "rdk", "slem", "slrs1"]
RESULTS: dict = {}


def say(key: str, value) -> None:
    RESULTS[key] = value
    print(f"{key}: {json.dumps(value, default=str)[:600]}", flush=True)


def make(out: Path) -> None:
    import tinymodels
    from edgespec.cli import main

    out.mkdir(parents=True, exist_ok=True)
    built = tinymodels.build_tiny_bundles(out / "work", which=("self",))
    a, sp = built["models"]["tiny-bl-a"], tinymodels.build_tiny_model(out / "work" / "hf" / "tiny-sp",
                                                                     built["tokenizers"]["spiece"], "spiece", seed=3,
                                                                     tie=True)
    n = json.loads((a / "config.json").read_text())["vocab_size"]
    keep = str(3 * n // 4)
    jobs = {"cpu-fp32": ["--drafter", str(a), "--graph", "builder"],
            "cpu-int4": ["--drafter", str(a), "--quantize", "int4", "--quality-tokens", "0"],
            "cuda-fp16-same": ["--drafter", str(a), "--ep", "cuda"],
            "cuda-fp16-hetero": ["--drafter", str(sp), "--ep", "cuda"],
            "cuda-int4": ["--drafter", str(a), "--ep", "cuda", "--quantize", "int4"]}
    for name, args in jobs.items():
        if not (out / name / "manifest.json").is_file():
            rc = main(["export", "--target", str(a), "--keep", keep, "--out", str(out / name), "--quiet", *args])
            assert rc == 0, name
    print(out)


def greedy(dec, prompt: str, n: int = 32) -> tuple[list[int], dict]:
    r = dec.generate(prompt, max_new_tokens=n, temperature=0.0)
    return r.token_ids, {"acceptance": r.stats.acceptance_rate, "tau": r.stats.tau}


def check_placement(bundles: dict, ep: str) -> None:
    from edgespec.runtime import Bundle
    from edgespec.runtime.engine.kv import ModelRunner
    from edgespec.runtime.engine.placement import KV_WRITERS, read_placement
    from edgespec.runtime.engine.sessions import create_session

    for name, path in bundles.items():
        b = Bundle.load(path)
        sess, info = create_session(b.target.runtime_onnx, ep, role="target")
        nodes = read_placement(sess) or []
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            runner = ModelRunner(sess, "target", b.target.max_position)
        writers = sorted({f"{n.op_type}@{n.ep}" for n in nodes if n.op_type in KV_WRITERS})
        off_ep = sorted({f"{n.op_type}" for n in nodes if n.ep != info.active[0]})
        say(f"placement/{name}", {"active": info.active[:1], "kv_writers": writers, "nodes_off_the_ep": off_ep,
                                  "shared": runner.shared, "kv_device": runner.device, "min_tokens": runner.min_tokens,
                                  "said": [str(w.message) for w in caught]})


def cpu_against_ep(bundles: dict, ep: str) -> None:
    from edgespec.runtime import Bundle, SpeculativeDecoder
    from edgespec.runtime.engine.kv import ModelRunner
    from edgespec.runtime.engine.sessions import create_session

    for name, path in bundles.items():
        b = Bundle.load(path)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            on_cpu, on_ep = SpeculativeDecoder(b, "ar", ep="cpu"), SpeculativeDecoder(b, "ar", ep=ep)
        oracle = ModelRunner(create_session(b.target.runtime_onnx, "cpu", role="oracle")[0], "oracle")
        same, ties, other, diffs = 0, 0, 0, []
        for p in PROMPTS:
            a, _ = greedy(on_cpu, p)
            c, _ = greedy(on_ep, p)
            if a == c:
                same += 1
                continue
            i = next(k for k in range(min(len(a), len(c))) if a[k] != c[k])
            ids = on_cpu.encode_prompt(p)
            oracle.reset()
            logits = oracle.forward(ids + a[:i])[-1]
            top2 = np.sort(logits)[-2:]
            near_tie = float(top2[1] - top2[0]) < 1e-3
            ties, other = ties + near_tie, other + (not near_tie)
            diffs.append({"prompt": p[:20], "position": i, "cpu_top2_margin": float(top2[1] - top2[0])})
        say(f"cpu_vs_{ep}/{name}", {"equal": same, "near_tie": ties, "differ": other, "first_divergences": diffs})


def strategies_against_ar(bundles: dict, ep: str) -> None:
    from edgespec.errors import EdgespecError
    from edgespec.runtime import Bundle, SpeculativeDecoder

    for name, path in bundles.items():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            base = SpeculativeDecoder(Bundle.load(path), "auto", ep=ep)
        ref = {p: greedy(base.variant("ar"), p)[0] for p in PROMPTS}
        rows = {}
        for strat in STRATEGIES:
            try:
                dec = base.variant(strat)
            except EdgespecError as exc:
                rows[strat] = f"n/a: {str(exc)[:100]}"
                continue
            outs = [greedy(dec, p) for p in PROMPTS]
            equal = sum(o[0] == ref[p] for o, p in zip(outs, PROMPTS))
            acc = [o[1]["acceptance"] for o in outs if o[1]["acceptance"] is not None]
            rows[strat] = {"equal_to_ar": f"{equal}/{len(PROMPTS)}",
                           "acceptance": round(float(np.mean(acc)), 3) if acc else None}
        say(f"strategies_vs_ar_on_{ep}/{name}", rows)


def batch_invariance(bundles: dict, ep: str) -> None:
    from edgespec.runtime import Bundle
    from edgespec.runtime.engine.kv import ModelRunner
    from edgespec.runtime.engine.sessions import create_session

    for name, path in bundles.items():
        b = Bundle.load(path)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            r = ModelRunner(create_session(b.target.runtime_onnx, ep, role="target")[0], "target")
        ids = b.target.tokenizer.encode("def quicksort(items): return sorted(items)").ids[:12]
        head, tail = ids[:8], ids[8:12]
        r.reset()
        r.forward(head, pad=False)
        one = np.concatenate([r.forward([t], pad=False).copy() for t in tail])   # valid until the next forward
        r.crop(len(head))
        four = r.forward(tail, pad=False).copy()
        r.crop(len(head))
        two = np.concatenate([r.forward(tail[:2], pad=False).copy(), r.forward(tail[2:], pad=False).copy()])
        say(f"batch_invariance_on_{ep}/{name}", {
            "one_vs_four_max_abs": float(np.abs(one - four).max()), "two_vs_four_max_abs": float(np.abs(two - four).max()),
            "one_vs_four_bitwise": bool(np.array_equal(one, four)), "two_vs_four_bitwise": bool(np.array_equal(two, four)),
            "argmax_equal": bool((one.argmax(-1) == four.argmax(-1)).all())})


def sampling(bundles: dict, ep: str, n: int = 2000) -> None:
    from distribution import (ALPHA, REJECTION, check_lossless, sample_tokens,
                              verify_without_residual as no_residual)
    from edgespec.runtime import Bundle, SpeculativeDecoder
    from edgespec.runtime.round import rounds as rounds_module
    from edgespec.runtime.samplers.sampling import SamplingParams

    for name in [k for k in ("cuda-fp16-same", "cpu-fp32") if k in bundles]:
        b = Bundle.load(bundles[name])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            dec = SpeculativeDecoder(b, strategy="tli", draft_length=4, ep=ep, options=REJECTION)  # runs the patched verify
            ids = b.target.tokenizer.encode("The quick brown").ids
            t0 = time.perf_counter()
            good = check_lossless(dec, b, ids, n=n, seed=0, temperature=1.0, ep=ep)
            real = rounds_module.verify_sampled
            rounds_module.verify_sampled = no_residual
            try:
                bad = check_lossless(dec, b, ids, samples=sample_tokens(dec, ids, n, 0, SamplingParams(1.0)), ep=ep)
            finally:
                rounds_module.verify_sampled = real
        say(f"sampling_on_{ep}/{name}", {"tli_pvalues": good, "tli_passes": min(good.values()) > ALPHA,
                                         "broken_verifier_pvalues": bad,
                                         "broken_verifier_fails": min(bad["x2"], bad["x3|x1x2"]) < ALPHA,
                                         "seconds": round(time.perf_counter() - t0, 1)})


def bench(bundles: dict, ep: str, out: Path) -> None:
    name = "cuda-fp16-same"
    cmd = [sys.executable, "-m", "edgespec", "bench", "--bundle", str(bundles[name]), "--ep", ep, "--peers",
           "--prompts", str(HERE / "mixed.jsonl"), "--limit", "4", "--max-new-tokens", "32", "--strategies",
           "ar,auto,tli", "--draft-length", "2,4,auto", "--repeats", "2", "--quiet", "--report", str(out / "bench-tiny")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, cwd=out)   # not the repository root
    print(proc.stdout[-3000:], proc.stderr[-1500:], sep="\n", flush=True)
    say(f"bench_on_{ep}/{name}", {"rc": proc.returncode, "stderr_tail": proc.stderr.strip().splitlines()[-3:]})


def main() -> int:
    if sys.argv[1] == "make":
        make(Path(sys.argv[2]))
        return 0
    root, out = Path(sys.argv[2]).resolve(), Path(sys.argv[3]).resolve()
    ep = sys.argv[sys.argv.index("--ep") + 1] if "--ep" in sys.argv else "cuda"
    out.mkdir(parents=True, exist_ok=True)
    import onnxruntime as ort

    say("environment", {"onnxruntime": ort.__version__, "available": ort.get_available_providers()})
    bundles = {p.name: p for p in sorted(root.iterdir()) if (p / "manifest.json").is_file()}
    steps = [("placement", lambda: check_placement(bundles, ep)), ("cpu_vs_ep", lambda: cpu_against_ep(bundles, ep)),
             ("strategies", lambda: strategies_against_ar(bundles, ep)),
             ("batch_invariance", lambda: batch_invariance(bundles, ep)), ("sampling", lambda: sampling(bundles, ep)),
             ("bench", lambda: bench(bundles, ep, out))]
    from gpu_graphs import run_all           # benchmarks/gpu_graphs.py: CUDA graphs, the graph's greedy ids
    steps.append(("cuda_graphs", lambda: run_all(bundles, ep, say)))
    if "--scale" in sys.argv:
        from gpu_scale import scale      # benchmarks/gpu_scale.py
        steps.append(("scale", lambda: scale(ep, out, say, root / "work" / "hf" / "tiny-bl-a")))
    for label, step in steps:
        t0 = time.perf_counter()
        try:
            step()
        except Exception:  # noqa: BLE001 - one failing check must not hide the others
            say(f"error/{label}", traceback.format_exc()[-1500:])
        print(f"[{label}: {time.perf_counter() - t0:.1f} s]", flush=True)
        (out / "gpu_check.json").write_text(json.dumps(RESULTS, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
