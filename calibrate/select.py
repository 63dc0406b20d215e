"""Choosing the kept drafter vocabulary from counts, coverage curves, and the vocab.json file.

Policies (VocabTrim §3 names Top-K, Top-P and minimum frequency):
  keep K       the always-kept tokens plus the highest-count others up to K in all;
  coverage P   the always-kept tokens plus the shortest prefix of the ranking whose counted mass
               reaches a fraction P of the total;
  min-count C  the always-kept tokens plus every token counted at least C times.
The ranking is by count, descending, ties broken by the lower token id, so the result is a pure
function of the counts. Always kept: special tokens (BOS/EOS/pad/unk and added tokens marked special)
and chat-control tokens (added tokens named in the chat template).
Coverage = counted mass of the kept tokens / total counted mass.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edgespec.errors import CalibrationError
from edgespec.runtime.bundle.vocab import (VOCAB_FORMAT, VOCAB_FORMAT_VERSION, as_tokenizer, read_vocab_file, tokenizer_info,
                                    vocab_hash)

POLICIES = ("keep", "coverage", "min-count")


@dataclass
class Selection:
    kept_ids: np.ndarray       # int64, sorted ascending
    policy: str
    value: float
    coverage: float            # of the calibration counts
    n_always: int


def ranking(counts: np.ndarray) -> np.ndarray:
    """Token ids by count descending, ties by id ascending (stable sort of -counts)."""
    return np.argsort(-np.asarray(counts, dtype=np.float64), kind="stable")


def coverage_of(counts: np.ndarray, kept_ids) -> float:
    counts = np.asarray(counts, dtype=np.float64)
    total = counts.sum()
    if total <= 0:
        raise CalibrationError("no token mass counted: cannot compute coverage")
    return float(counts[np.asarray(kept_ids, dtype=np.int64)].sum() / total)


def select(counts: np.ndarray, policy: str, value: float, always: list[int] | np.ndarray) -> Selection:
    counts = np.asarray(counts, dtype=np.float64)
    v = counts.size
    if counts.sum() <= 0:
        raise CalibrationError("empty corpus: every token count is zero")
    always = np.unique(np.asarray([a for a in always if 0 <= a < v], dtype=np.int64))
    order = ranking(counts)
    others = order[~np.isin(order, always)]
    if policy == "keep":
        k = _check_keep(value, v, always.size)
        chosen = others[: k - always.size]
    elif policy == "coverage":
        p = float(value)
        if not 0.0 < p <= 1.0:
            raise CalibrationError(f"--coverage must be in (0, 1], got {value}")
        total = counts.sum()
        need = p * total - counts[always].sum()
        cum = np.cumsum(counts[others])
        n = int(np.searchsorted(cum, need * (1 - 1e-12), side="left")) + 1 if need > 0 else 0
        chosen = others[: min(n, others.size)]
    elif policy == "min-count":
        c = float(value)
        if not c > 0:
            raise CalibrationError(f"--min-count must be positive, got {value}")
        chosen = others[counts[others] >= c]
    else:
        raise CalibrationError(f"unknown policy {policy!r}; use one of {', '.join(POLICIES)}")
    kept = np.sort(np.concatenate([always, chosen]).astype(np.int64))
    return Selection(kept, policy, float(value), coverage_of(counts, kept), int(always.size))


def reuse(vocab_doc: dict, counts: np.ndarray, vocab_size: int) -> Selection:
    """The kept set of an existing vocab.json (checked by `read_vocab`), with its coverage of `counts`."""
    kept = np.asarray(vocab_doc["kept_ids"], dtype=np.int64)
    if kept[0] < 0 or kept[-1] >= vocab_size:
        raise CalibrationError(f"--vocab: kept id {int(kept[-1])} is outside the drafter vocabulary ({vocab_size})")
    prov = vocab_doc.get("provenance") or {}
    return Selection(kept, str(prov.get("policy", "keep")), float(prov.get("policy_value", kept.size)),
                     coverage_of(counts, kept), int(prov.get("always_kept", 0)))


def _check_keep(value: float, v: int, n_always: int) -> int:
    if float(value) != int(value):
        raise CalibrationError(f"--keep must be an integer, got {value}")
    k = int(value)
    if k < 1 or k > v:
        raise CalibrationError(f"--keep {k} is out of range: must be between 1 and the drafter vocabulary size {v}")
    if k < n_always:
        raise CalibrationError(f"--keep {k} is smaller than the {n_always} special/chat-control tokens that are always kept")
    return k


def always_kept(model_dir, tokenizer=None) -> list[int]:
    """Special tokens (as export keeps them) plus added tokens the chat template names."""
    info = tokenizer_info(model_dir, tokenizer)
    ids = set(info.special_ids)
    if info.chat_template:
        tok = as_tokenizer(tokenizer if tokenizer is not None else model_dir)
        for i, added in tok.get_added_tokens_decoder().items():
            if added.content and added.content in info.chat_template:
                ids.add(int(i))
    return sorted(ids)


# --------------------------------------------------------------------------- coverage curves

def curve_points(v: int, n: int = 160) -> np.ndarray:
    """K values for a coverage curve: log-spaced from 1 to v plus every power of two."""
    ks = np.unique(np.concatenate([np.geomspace(1, v, n).round(), 2 ** np.arange(int(np.log2(v)) + 1), [v]]))
    return ks.astype(np.int64)


def coverage_curve(counts: np.ndarray, ks: np.ndarray, order: np.ndarray | None = None) -> np.ndarray:
    """Coverage of `counts` by the first K tokens of `order` (default: the counts' own ranking)."""
    counts = np.asarray(counts, dtype=np.float64)
    order = ranking(counts) if order is None else order
    cum = np.concatenate([[0.0], np.cumsum(counts[order])])
    total = cum[-1]
    if total <= 0:
        raise CalibrationError("no token mass: cannot draw a coverage curve")
    return cum[np.minimum(ks, order.size)] / total


def plot_curve(doc: dict, path: Path) -> None:
    """Coverage against K (log x), the calibration curve and any held-out curves."""
    import matplotlib  # lazy: the optional [calibrate] extra; a missing matplotlib only skips the PNG

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: matplotlib is optional (plots only)

    fig, ax = plt.subplots(figsize=(6.4, 4.2), dpi=110)
    ks = np.asarray(doc["k"])
    ax.plot(ks, doc["coverage"], label=f"calibration ({doc['source']})", lw=1.8)
    for name, ys in (doc.get("heldout") or {}).items():
        ax.plot(ks, ys, label=f"held-out: {name}", lw=1.2, ls="--")
    kept = doc.get("kept")
    if kept:
        ax.axvline(kept, color="grey", lw=0.8, ls=":")
        ax.annotate(f"K={kept}\n{doc['kept_coverage']:.4f}", (kept, doc["kept_coverage"]), fontsize=8,
                    xytext=(-60, -30), textcoords="offset points")
    ax.set_xscale("log")
    ax.set_xlabel("kept tokens K (top-K by count)")
    ax.set_ylabel("coverage of counted tokens")
    ax.set_ylim(0, 1.01)
    ax.set_title(f"token coverage, drafter vocabulary {doc['vocab_size']}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, metadata={"Software": None})
    plt.close(fig)


# --------------------------------------------------------------------------- vocab.json

def vocab_document(selection: Selection, vocab_hash: str, vocab_size: int, provenance: dict,
                   priors_dir: str | None) -> dict:
    prov = {"policy": selection.policy, "policy_value": selection.value, "coverage": selection.coverage,
            "always_kept": selection.n_always, **provenance}
    return {"format": VOCAB_FORMAT, "format_version": VOCAB_FORMAT_VERSION,
            "tokenizer": {"vocab_hash": vocab_hash, "vocab_size": int(vocab_size)},
            "kept_ids": [int(i) for i in selection.kept_ids], "provenance": prov, "priors_dir": priors_dir}


def read_vocab(path: str | Path, tokenizer=None) -> dict:
    """Read and check a vocab.json; with `tokenizer`, refuse a file made for another tokenizer."""
    doc = read_vocab_file(path, vocab_hash(tokenizer) if tokenizer is not None else None, CalibrationError)
    ids = doc["kept_ids"]
    if ids != sorted(set(ids)):
        raise CalibrationError(f"{path}: kept_ids must be a non-empty ascending list of unique ids")
    return doc
