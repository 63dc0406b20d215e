"""A model runner over one ORT session: feeds by name, keeps the KV cache as NumPy arrays.

- `forward(ids)` runs the model on `ids` after everything already cached and returns the logits
  of those positions, [len(ids), V] (a view into ORT's output; valid until the next forward).
  With an empty cache this is the prefill: one forward over the whole prompt.
- The `present.*` outputs become the next call's `past_key_values.*` inputs (no copy on our side).
- `crop(n)` keeps the first n cached positions: a slice along the sequence axis (axis 2 of
  [1, kv_heads, seq, head_dim]), never a re-run of the prefix.
- Each forward's wall time (ms) is added to `time_ms` / `last_ms`, so callers can attribute time
  without wrapping calls.
"""
from __future__ import annotations

import time
from typing import Sequence

import numpy as np

from edgespec.errors import BundleError

_PAST_PREFIX = "past_key_values."
_PRESENT_PREFIX = "present."
_ORT_TO_NUMPY = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(double)": np.float64,
                 "tensor(bfloat16)": np.float32}


class ModelRunner:
    """Runs a causal LM exported with past inputs (docs/architecture.md, "The target graph")."""

    def __init__(self, session, role: str = "model", max_position: int | None = None):
        self.session = session
        self.role = role
        self.max_position = max_position
        inputs = {i.name: i for i in session.get_inputs()}
        outputs = [o.name for o in session.get_outputs()]
        for need in ("input_ids", "attention_mask"):
            if need not in inputs:
                raise BundleError(f"{role} graph has no input {need!r} (inputs: {', '.join(inputs)})")
        if "logits" not in outputs:
            raise BundleError(f"{role} graph has no output 'logits'")
        self.past_names = [n for n in inputs if n.startswith(_PAST_PREFIX)]
        self.present_names = [_PRESENT_PREFIX + n[len(_PAST_PREFIX):] for n in self.past_names]
        missing = [n for n in self.present_names if n not in outputs]
        if missing:
            raise BundleError(f"{role} graph lacks outputs {missing[:2]} for its past inputs")
        if not self.past_names:
            raise BundleError(f"{role} graph has no past_key_values inputs (export with past)")
        self.has_position_ids = "position_ids" in inputs
        shape = inputs[self.past_names[0]].shape          # [batch, kv_heads, past, head_dim]
        self.kv_heads, self.head_dim = int(shape[1]), int(shape[3])
        self.kv_dtype = _ORT_TO_NUMPY.get(inputs[self.past_names[0]].type, np.float32)
        self.vocab = session.get_outputs()[outputs.index("logits")].shape[-1]
        self.output_names = ["logits", *self.present_names]
        # A quantized graph may declare that 1-token forwards take another kernel path (MatMulNBits with
        # accuracy_level 4); forward() then pads them so every forward computes the same function.
        meta = getattr(session.get_modelmeta(), "custom_metadata_map", None) or {}
        self.min_tokens = max(1, int(meta.get("edgespec.min_forward_tokens", 1)))
        self.extra_outputs = [n for n in outputs if n not in self.output_names]
        self.time_ms = 0.0           # totals over the runner's life (callers book per-generation time)
        self.last_ms = 0.0
        self.forwards = 0
        self.tokens_fed = 0
        self.reset()

    # ------------------------------------------------------------------ state
    def reset(self) -> None:
        """Empty the cache (the next forward is a prefill)."""
        empty = np.zeros((1, self.kv_heads, 0, self.head_dim), dtype=self.kv_dtype)
        self.past = [empty] * len(self.past_names)
        self.length = 0

    def crop(self, n: int) -> None:
        """Keep the first n cached positions (n <= length)."""
        if n < 0 or n > self.length:
            raise ValueError(f"cannot crop a {self.length}-position cache to {n}")
        if n == self.length:
            return
        self.past = [p[:, :, :n, :] for p in self.past]
        self.length = n

    # ------------------------------------------------------------------ running
    def forward(self, ids: Sequence[int] | np.ndarray) -> np.ndarray:
        """Logits [len(ids), V] for `ids` appended after the cached positions; the cache grows by len(ids)."""
        if 0 < len(ids) < self.min_tokens:  # pad with the last id, then drop it: causal, so exact
            flat = np.asarray(ids, dtype=np.int64).ravel()
            pad = self.min_tokens - flat.size
            logits = self.forward(np.concatenate([flat, np.repeat(flat[-1:], pad)]))
            self.crop(self.length - pad)
            return logits[:flat.size]
        s = len(ids)
        past = self.length
        feeds = {"input_ids": np.asarray(ids, dtype=np.int64).reshape(1, s),
                 "attention_mask": np.ones((1, past + s), dtype=np.int64)}
        if self.has_position_ids:
            feeds["position_ids"] = np.arange(past, past + s, dtype=np.int64).reshape(1, s)
        for name, arr in zip(self.past_names, self.past):
            # A cropped cache is a strided view; ORT needs C-contiguous input (one copy, only after a crop).
            feeds[name] = arr if arr.flags.c_contiguous else np.ascontiguousarray(arr)
        t0 = time.perf_counter()
        out = self.session.run(self.output_names, feeds)
        self.last_ms = (time.perf_counter() - t0) * 1e3
        self.time_ms += self.last_ms
        self.forwards += 1
        self.tokens_fed += s
        self.past = out[1:]
        self.length = past + s
        return out[0][0]

    def run_extra(self, names: Sequence[str]) -> list[np.ndarray]:
        """Run a 1-token forward on a fresh cache just to read constant outputs (e.g. the drafter's
        `index_map`); the runner's cache is left untouched."""
        feeds = {"input_ids": np.zeros((1, 1), dtype=np.int64), "attention_mask": np.ones((1, 1), dtype=np.int64)}
        if self.has_position_ids:
            feeds["position_ids"] = np.zeros((1, 1), dtype=np.int64)
        empty = np.zeros((1, self.kv_heads, 0, self.head_dim), dtype=self.kv_dtype)
        for name in self.past_names:
            feeds[name] = empty
        return self.session.run(list(names), feeds)
