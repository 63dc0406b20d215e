"""Export-time quality check of a quantized graph against its float original, teacher-forced.

Both graphs read the same held-out token sequences (one prefill per sequence, past length 0). Per
position, with p = softmax(fp32 logits) and q = softmax(quantized logits):
  top1_agreement  fraction of positions where argmax q == argmax p (greedy decoding agrees);
  mean_overlap    mean of sum_v min(p_v, q_v), the acceptance rate a sampled speculative step would
                  have if q drafted for p (1.0 = identical distributions).

Acceptability (ACCEPT): top1 >= 0.90 and overlap >= 0.90 is "ok"; below that the manifest says
"degraded" and the export warns (it does not fail: a degraded bundle is still exactly lossless with
respect to *its own* quantized target). The thresholds sit below the gap between two real models:
Qwen2.5-Coder 1.5B vs 0.5B agree 71.5% / overlap 0.706 (FACTS.md), so "ok" means the quantized target
is much closer to fp32 than a smaller sibling model is.

Held-out text: by default the first tokens of a few Python standard-library modules (code with
English docstrings), present on every machine and disjoint from the benchmark prompts (HumanEval)
and the calibration corpora.
"""
from __future__ import annotations

import gc
import sysconfig
from pathlib import Path

import numpy as np

from edgespec.errors import ExportError

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
    from tokenizers import Tokenizer

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


def _session(path: Path, threads: int):
    from edgespec.export.onnx_export import ort_session

    return ort_session(Path(path), threads=threads)


def _prefill_logits(sess, ids: np.ndarray) -> np.ndarray:
    """Logits [s, V] of one prefill over `ids` with an empty KV cache."""
    inputs = {i.name: i for i in sess.get_inputs()}
    s = ids.size
    feed = {"input_ids": ids[None, :], "attention_mask": np.ones((1, s), np.int64)}
    if "position_ids" in inputs:
        feed["position_ids"] = np.arange(s, dtype=np.int64)[None, :]
    for name, i in inputs.items():
        if name.startswith("past_key_values."):
            feed[name] = np.zeros((1, int(i.shape[1]), 0, int(i.shape[3])), np.float32)
    return sess.run(["logits"], feed)[0][0]


def _softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64, copy=False)
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def compare(reference_onnx: Path, quantized_onnx: Path, seqs: list[np.ndarray], threads: int = 1) -> dict:
    """Teacher-forced top-1 agreement and mean sum-min overlap of `quantized_onnx` vs `reference_onnx`.

    The two sessions never coexist: the reference's argmax and probabilities are kept (float32),
    then it is freed before the quantized graph is loaded."""
    sess = _session(reference_onnx, threads)
    ref = [_softmax(_prefill_logits(sess, s)).astype(np.float32) for s in seqs]
    del sess
    gc.collect()
    sess = _session(quantized_onnx, threads)
    agree = overlap = n = 0.0
    for s, p in zip(seqs, ref):
        q = _softmax(_prefill_logits(sess, s))
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
