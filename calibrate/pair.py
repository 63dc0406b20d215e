"""The target/drafter pair of a calibration: tokenizers, vocabulary maps, and engines on demand.

Models come from `--bundle DIR` (tokenizers and ONNX graphs from the bundle; torch only where a
bundle cannot serve: drafter generation or drafter logits for a kept set the bundle's pruned head
does not contain), or from `--pair NAME` / `--target SRC --drafter SRC` (edgespec model sources,
run through torch). Nothing heavy is loaded until a source needs it.
"""
from __future__ import annotations

import json
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from edgespec.calibrate.forced_logits import OrtLogits, TorchLogits
from edgespec.calibrate.generate import BundleGenerator, TorchGenerator
from edgespec.calibrate.select import always_kept
from edgespec.errors import CalibrationError
from edgespec.export.sources import resolve
from edgespec.models import get_pair
from edgespec.runtime.bundle.bundle import Bundle
from edgespec.runtime.bundle.manifest import manifest_sha256
from edgespec.runtime.bundle.vocab import as_tokenizer, build_maps, vocab_hash


@dataclass
class Models:
    pair: str | None
    t_tok: object
    d_tok: object
    t_hash: str
    d_hash: str
    v_t: int
    v_d: int
    d2t: np.ndarray
    t2d: np.ndarray
    always_kept: list[int]
    same_model: bool
    inputs: dict
    specs: dict                          # side -> model source spec (for torch fallbacks)
    bundle: object = None
    ep: str = "cpu"
    threads: int | None = 1
    chat: bool | None = None
    _dirs: dict = field(default_factory=dict)
    _logits: dict = field(default_factory=dict)

    @property
    def same_tokenizer(self) -> bool:
        return self.t_hash == self.d_hash

    def hf_dir(self, side: str) -> Path:
        if side not in self._dirs:
            spec = self.specs.get(side)
            if not spec:
                raise CalibrationError(f"the {side} model is needed through torch here, but no source is known; "
                                       "give --pair or --target/--drafter")
            self._dirs[side] = resolve(spec).hf_dir
        return self._dirs[side]

    # ------------------------------------------------------------------ generation
    def generator(self, side: str):
        if self.bundle is not None and (side == "target" or self.same_model):
            return BundleGenerator(self.bundle, self.ep, self.threads, self.chat)
        return TorchGenerator(self.hf_dir(side), self.chat)

    # ------------------------------------------------------------------ teacher forcing
    def target_logits(self):
        """fn(ids, rows) -> target logits [len(rows), V_t]."""
        if "target" not in self._logits:
            if self.bundle is not None:
                inner = OrtLogits(self.bundle.target.onnx, ep=self.ep, threads=self.threads, role="target")
            else:
                inner = TorchLogits(self.hf_dir("target"))
            self._logits["target"] = _Memo(inner)
        return self._logits["target"]

    def drafter_logits(self, kept_ids: np.ndarray):
        """fn(ids, rows) -> drafter logits at the kept ids [len(rows), K], and a description."""
        kept_ids = np.asarray(kept_ids, dtype=np.int64)
        if self.same_model and self.same_tokenizer:
            return _ColumnsOf(self.target_logits(), kept_ids), "target graph (drafter is the target model)"
        if self.bundle is not None:
            pos = {int(d): i for i, d in enumerate(self.bundle.draft_ids)}
            if all(int(k) in pos for k in kept_ids):
                cols = np.array([pos[int(k)] for k in kept_ids], dtype=np.int64)
                return OrtLogits(self.bundle.drafter.onnx, cols=cols, ep=self.ep, threads=self.threads,
                                 role="drafter"), "bundle drafter graph"
        return TorchLogits(self.hf_dir("drafter"), cols=kept_ids), "torch drafter"

    def measure_lambda(self, n_steps: int = 24) -> tuple[float, str]:
        """Drafter/target decode-step time ratio: the bundle's graphs (pruned drafter) on the chosen EP,
        else the torch models (full drafter head). Single-token steps after a 32-token prefill,
        drafter and target interleaved so that machine load hits both alike; ratio of the medians."""
        t = self.target_logits().inner
        if self.bundle is not None:
            d = OrtLogits(self.bundle.drafter.onnx, ep=self.ep, threads=self.threads, role="drafter")
            steps = [(d.runner.forward, d.runner.reset), (t.runner.forward, t.runner.reset)]
            where = f"onnx {self.ep}"
        else:
            d = TorchLogits(self.hf_dir("drafter"))
            steps = [(d._forward, lambda: setattr(d, "past", None)), (t._forward, lambda: setattr(t, "past", None))]
            where = "torch cpu (full drafter head)"
        d_ms, t_ms = _interleaved_step_ms(steps, n_steps)
        return d_ms / t_ms, where


def _interleaved_step_ms(steps, n_steps: int) -> list[float]:
    """Median ms of a 1-token decode step for each (forward, reset), measured alternately."""
    for forward, reset in steps:
        reset()
        forward(np.arange(1, 33, dtype=np.int64))
    times: list[list[float]] = [[] for _ in steps]
    for i in range(n_steps):
        for j, (forward, _) in enumerate(steps):
            t0 = time.perf_counter()
            forward(np.array([100 + i], dtype=np.int64))
            times[j].append(time.perf_counter() - t0)
    return [statistics.median(ts[2:]) * 1e3 for ts in times]


class _Memo:
    """Remembers the last call, so the drafter-is-the-target case runs the model once per sequence."""

    def __init__(self, inner):
        self.inner = inner
        self._key = None
        self._val = None

    def __call__(self, ids: np.ndarray, rows: np.ndarray) -> np.ndarray:
        key = (np.asarray(ids).tobytes(), np.asarray(rows).tobytes())
        if key != self._key:
            self._key, self._val = key, self.inner(ids, rows)
        return self._val


class _ColumnsOf:
    """The drafter's logits at the kept ids, read from the target's (identical model) logits."""

    def __init__(self, fn, cols: np.ndarray):
        self.fn, self.cols = fn, cols

    def __call__(self, ids: np.ndarray, rows: np.ndarray) -> np.ndarray:
        return self.fn(ids, rows)[:, self.cols]


def _config_vocab(hf_dir: Path, tok) -> int:
    try:
        return int(json.loads((Path(hf_dir) / "config.json").read_text())["vocab_size"])
    except (OSError, KeyError, ValueError):
        return int(tok.get_vocab_size(with_added_tokens=True))


def resolve_models(cfg) -> Models:
    specs: dict = {}
    pair = cfg.pair
    if cfg.pair:
        if cfg.target or cfg.drafter:
            raise CalibrationError("give either --pair NAME or --target SRC --drafter SRC, not both")
        p = get_pair(cfg.pair)
        specs = {"target": p.target, "drafter": p.drafter}
    elif cfg.target or cfg.drafter:
        if not (cfg.target and cfg.drafter):
            raise CalibrationError("give both --target SRC and --drafter SRC (or --pair NAME)")
        specs = {"target": cfg.target, "drafter": cfg.drafter}
    inputs: dict = {}
    if cfg.bundle is not None:
        b = Bundle.load(cfg.bundle, verify="fast")
        man = b.manifest
        for side in ("target", "drafter"):
            src = man[side].get("source") or {}
            specs.setdefault(side, src.get("spec"))
            inputs[side] = {"spec": src.get("spec"), "sha256": src.get("sha256")}
        inputs["bundle"] = {"path": str(cfg.bundle), "manifest_sha256": manifest_sha256(cfg.bundle)}
        t_tok, d_tok = b.target.tokenizer, b.drafter.tokenizer
        v_t, v_d = int(man["target"]["vocab_size"]), int(man["drafter"]["vocab_size"])
        same_model = bool(inputs["target"]["sha256"]) and inputs["target"]["sha256"] == inputs["drafter"]["sha256"]
        keep = set(always_kept(b.drafter.dir, d_tok))
        tk = man["drafter"].get("tokenizer") or {}
        keep |= {int(i) for i in [tk.get("bos_id"), tk.get("pad_id"), *(tk.get("eos_ids") or [])] if i is not None}
        pair = pair or man.get("pair")
        models = Models(pair, t_tok, d_tok, vocab_hash(t_tok), vocab_hash(d_tok), v_t, v_d, b.drafter_to_target,
                        b.target_to_drafter, sorted(keep), same_model, inputs, specs, bundle=b)
    else:
        if not specs:
            raise CalibrationError("name the models: --pair NAME, --target SRC --drafter SRC, or --bundle DIR")
        srcs = {side: resolve(spec) for side, spec in specs.items()}
        inputs = {side: {"spec": s.spec, "sha256": s.sha256} for side, s in srcs.items()}
        dirs = {side: s.hf_dir for side, s in srcs.items()}
        t_tok, d_tok = as_tokenizer(dirs["target"]), as_tokenizer(dirs["drafter"])
        v_t, v_d = _config_vocab(dirs["target"], t_tok), _config_vocab(dirs["drafter"], d_tok)
        d2t, t2d = build_maps(t_tok, d_tok, v_t, v_d)
        models = Models(pair, t_tok, d_tok, vocab_hash(t_tok), vocab_hash(d_tok), v_t, v_d, d2t[:v_d], t2d[:v_t],
                        always_kept(dirs["drafter"], d_tok), srcs["target"].sha256 == srcs["drafter"].sha256,
                        inputs, specs, _dirs=dirs)
    models.ep, models.threads, models.chat = cfg.ep, cfg.threads, cfg.chat
    return models
