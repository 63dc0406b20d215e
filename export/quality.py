"""Export-time quality check of a quantized graph against its float original, teacher-forced.

Both graphs read the same held-out token sequences (one prefill per sequence, past length 0). Per
position, with p = softmax(fp32 logits) and q = softmax(quantized logits):
  top1_agreement  fraction of positions where argmax q == argmax p (greedy decoding agrees);
  mean_overlap    mean of sum_v min(p_v, q_v), the acceptance rate a sampled speculative step would
                  have if q drafted for p (1.0 = identical distributions).

Acceptability (ACCEPT): top1 >= 0.90 and overlap >= 0.90 is "ok"; below that the manifest says
"degraded" and the export warns (it does not fail: a degraded bundle is still exactly lossless with
respect to *its own* quantized target). The thresholds sit below the gap between two real models:
Qwen2.5-Coder 1.5B vs 0.5B agree 71.5% / overlap 0.706 (docs/facts.md), so "ok" means the quantized target
is much closer to fp32 than a smaller sibling model is.

Held-out text: by default the first tokens of a few Python standard-library modules (code with
English docstrings), present on every machine and disjoint from the benchmark prompts (HumanEval)
and the calibration corpora.
"""
from __future__ import annotations

import gc
import sys
import sysconfig
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from edgespec.errors import ExportError
from edgespec.export.onnx_export import ort_session
from edgespec.runtime.engine.kv import MIN_TOKENS_KEY, default_feeds
from edgespec.runtime.samplers.sampling import softmax

ACCEPT = {"top1_agreement": 0.90, "mean_overlap": 0.90}
DEFAULT_FILES = ("textwrap.py", "heapq.py", "fractions.py", "statistics.py")
DEFAULT_TOKENS = 512
SEGMENT = 128


def held_out_texts(files=DEFAULT_FILES) -> list[tuple[str, str]]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    out = []
    for name in files:
        p = Path(name) if Path(name).is_absolute() else stdlib / name
        try:
            out.append((p.name, p.read_text(encoding="utf-8", errors="replace")))
        except OSError as exc:
            raise ExportError(f"quality check: cannot read held-out text {p}: {exc.strerror}") from exc
    return out


def held_out_ids(tokenizer_json: Path, n_tokens: int = DEFAULT_TOKENS, segment: int = SEGMENT,
                 texts: list[tuple[str, str]] | None = None) -> list[np.ndarray]:
    """Token sequences of `segment` tokens, n_tokens in all, spread over the held-out texts."""
    tok = Tokenizer.from_file(str(tokenizer_json))
    texts = texts if texts is not None else held_out_texts()
    per_text = max(1, -(-n_tokens // max(1, len(texts))))
    seqs = []
    for _, text in texts:
        ids = tok.encode(text, add_special_tokens=False).ids[:per_text]
        seqs += [np.asarray(ids[i:i + segment], dtype=np.int64) for i in range(0, len(ids), segment)]
    seqs = [s for s in seqs if s.size >= 2]
    if not seqs:
        raise ExportError("quality check: the held-out text gave no tokens")
    return seqs


def _session(path: Path, threads: int, prepack: bool = False):
    """The float reference runs without prepacking (memory: fp32 weights held once); a quantized graph
    runs as the runtime runs it, prepacked: MatMulNBits picks its kernels (accuracy_level) at prepack."""
    if not prepack:
        return ort_session(Path(path), threads=threads)
    import onnxruntime as ort  # lazy: `edgespec --help` imports this module; onnx and ORT load on use

    ort.set_default_logger_severity(3)
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    so.log_severity_level = 3
    return ort.InferenceSession(str(path), sess_options=so, providers=["CPUExecutionProvider"])


def _prefill_logits(sess, ids: np.ndarray) -> np.ndarray:
    """Logits [s, V] of one prefill over `ids` with an empty KV cache."""
    return _chunked_logits(sess, [ids])


def _chunked_logits(sess, chunks: list[np.ndarray]) -> np.ndarray:
    """Logits [sum of lengths, V]: the chunks fed one forward each, through the KV cache."""
    inputs = {i.name: i for i in sess.get_inputs()}
    outs = [o.name for o in sess.get_outputs() if o.name == "logits" or o.name.startswith("present.")]
    past = {n: np.zeros((1, int(i.shape[1]), 0, int(i.shape[3])), np.float32)
            for n, i in inputs.items() if n.startswith("past_key_values.")}
    pos, logits = 0, []
    for c in chunks:
        s = c.size
        feed = {"input_ids": c[None, :], "attention_mask": np.ones((1, pos + s), np.int64), **past}
        if "position_ids" in inputs:
            feed["position_ids"] = np.arange(pos, pos + s, dtype=np.int64)[None, :]
        res = dict(zip(outs, sess.run(outs, {**feed, **default_feeds(sess)})))
        logits.append(res["logits"][0])
        past = {n.replace("present.", "past_key_values."): v for n, v in res.items() if n != "logits"}
        pos += s
    return np.concatenate(logits)


BATCH_TOL = 2e-3     # fp32 graphs differ by ~1e-4 between 1-token and k-token forwards here


def batch_invariance(onnx_path: Path, ids: np.ndarray, threads: int = 1, prefix: int = 16, tail: int = 12) -> dict:
    """Does a position's logits depend on how many tokens its forward carries? (Speculative decoding
    is exact only if a k-token verify computes what k 1-token steps would.) Runs the graph prepacked,
    as the runtime does: `tail` tokens after a `prefix`-token prefill, fed 1, 2, 3 and 12 at a time.

    min_forward_tokens: 1 if every width agrees; 2 if 1-token forwards differ but all widths >= 2
    agree (int8-activation graphs: GroupQueryAttention's 1-query path rounds differently, and the next
    layer's activation quantisation amplifies it: docs/quantization.md); None if
    widths >= 2 disagree too (no exact speculative decoding on this graph)."""
    if ids.size < prefix + tail:
        raise ExportError(f"batch-invariance check needs {prefix + tail} tokens, got {ids.size}")
    head, rest = ids[:prefix], ids[prefix:prefix + tail]
    sess = _session(onnx_path, threads, prepack=True)

    def width(k: int) -> np.ndarray:
        return _chunked_logits(sess, [head] + [rest[i:i + k] for i in range(0, tail, k)])[prefix:]

    w1, w2, w3, wall = width(1), width(2), width(3), width(tail)
    del sess
    gc.collect()
    d1 = float(np.abs(w1 - w2).max())
    d2 = float(max(np.abs(w2 - w3).max(), np.abs(w2 - wall).max()))
    minimum = 1 if max(d1, d2) <= BATCH_TOL else (2 if d2 <= BATCH_TOL else None)
    return {"one_vs_two_max_abs_diff": d1, "two_vs_wider_max_abs_diff": d2, "tolerance": BATCH_TOL,
            "min_forward_tokens": minimum}


def measure_batch_invariance(onnx_path: Path, tokenizer_json: Path, progress: bool) -> dict:
    """batch_invariance on held-out text; when only 1-token forwards differ, record in the graph's
    metadata that exact forwards carry >= 2 tokens (runtime/engine/kv.py's ModelRunner pads a 1-token forward
    of an exact runner, the target's, with a dummy token it then drops; a drafter's runner ignores it)."""
    ids = np.concatenate(held_out_ids(tokenizer_json, n_tokens=64, segment=64))
    res = batch_invariance(onnx_path, ids)
    if res["min_forward_tokens"] is not None and res["min_forward_tokens"] > 1:
        import onnx  # lazy: onnx is the [export] extra

        model = onnx.load(str(onnx_path), load_external_data=False)
        for p in [p for p in model.metadata_props if p.key == MIN_TOKENS_KEY]:
            model.metadata_props.remove(p)
        model.metadata_props.add(key=MIN_TOKENS_KEY, value=str(res["min_forward_tokens"]))
        onnx.save_model(model, str(onnx_path))
    return res


def require_exact_target(res: dict | None, progress: bool) -> None:
    """Refuse a quantized target whose logits depend on the forward's width beyond 1 token (a drafter's
    numerics never change the output, so drafters are not held to this); say when 1-token forwards
    differ and the runtime will pad them."""
    if not res or "min_forward_tokens" not in res:
        return
    if res["min_forward_tokens"] is None:
        raise ExportError(f"the quantized target's logits change with the number of tokens per forward "
                          f"(max |diff| {res['two_vs_wider_max_abs_diff']:.3g} between 2- and wider forwards): "
                          "speculative decoding would not be exact; use --accuracy-level 1 or --block-size 32")
    if res["min_forward_tokens"] > 1 and progress:
        print(f"edgespec: 1-token forwards of the quantized target differ by {res['one_vs_two_max_abs_diff']:.2g} "
              "from wider ones (attention's 1-query path): the bundle asks the runtime for >= 2 tokens per forward",
              file=sys.stderr, flush=True)


def check_batch_invariance(onnx_path: Path, tokenizer_json: Path, progress: bool) -> dict:
    """measure_batch_invariance of a quantized target, refused where it is not exact (require_exact_target)."""
    res = measure_batch_invariance(onnx_path, tokenizer_json, progress)
    require_exact_target(res, progress)
    return res


def compare(reference_onnx: Path, quantized_onnx: Path, seqs: list[np.ndarray], threads: int = 1) -> dict:
    """Teacher-forced top-1 agreement and mean sum-min overlap of `quantized_onnx` vs `reference_onnx`.

    The two sessions never coexist: the reference's argmax and probabilities are kept (float32),
    then it is freed before the quantized graph is loaded."""
    sess = _session(reference_onnx, threads)
    ref = [softmax(_prefill_logits(sess, s), dtype=np.float64).astype(np.float32) for s in seqs]
    del sess
    gc.collect()
    sess = _session(quantized_onnx, threads, prepack=True)
    agree = overlap = n = 0.0
    for s, p in zip(seqs, ref):
        q = softmax(_prefill_logits(sess, s), dtype=np.float64)
        if q.shape != p.shape:
            raise ExportError(f"quality check: quantized logits {q.shape} vs reference {p.shape}")
        agree += float((q.argmax(-1) == p.argmax(-1)).sum())
        overlap += float(np.minimum(p, q).sum())
        n += q.shape[0]
    del sess
    gc.collect()
    top1, ovl = agree / n, overlap / n
    ok = top1 >= ACCEPT["top1_agreement"] and ovl >= ACCEPT["mean_overlap"]
    return {"top1_agreement": round(top1, 4), "mean_overlap": round(ovl, 4), "positions": int(n),
            "sequences": len(seqs), "threshold": dict(ACCEPT), "verdict": "ok" if ok else "degraded"}


def quality_check(reference_onnx: Path, quantized_onnx: Path, tokenizer_json: Path,
                  n_tokens: int = DEFAULT_TOKENS, threads: int = 1, texts=None) -> dict:
    seqs = held_out_ids(Path(tokenizer_json), n_tokens, texts=texts)
    res = compare(Path(reference_onnx), Path(quantized_onnx), seqs, threads)
    res["text"] = "python stdlib: " + ", ".join(DEFAULT_FILES) if texts is None else "custom"
    return res
