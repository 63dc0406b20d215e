"""The shared KV layout of kv.ModelRunner (builder graphs, GroupQueryAttention): one preallocated buffer
per `past_key_values.*` input, [1, kv_heads, capacity, head_dim], bound once through IOBinding as both
the past input and the `present.*` output of every session that runs the graph (the graph's and its
prefill graph's). Attention reads positions [0, length) and writes the new ones in place: a forward
moves only input_ids, the attention mask and the logits, and a rollback is a change of `length`. The
buffers live on the EP's device (CPU memory, or CUDA/DirectML OrtValues on a GPU EP) and the logits
are bound to host memory, so on a GPU only the logits rows cross the bus. Capacity grows by doubling
(one copy of the cache per growth); `reserve(n)` sizes it up front so a generation never grows it.
"""
from __future__ import annotations

import numpy as np

CAPACITY_STEP = 256
LOGITS_TO_KEEP = "logits_to_keep"        # the graph input export/last_logits.py adds


def keep_feed(rows: int, s: int) -> np.ndarray:
    """The `logits_to_keep` input for `rows` of an `s`-token forward."""
    return np.array([0 if rows == s else rows], dtype=np.int64)      # 0: every position


def as_float32(logits: np.ndarray) -> np.ndarray:
    """Logits as float32 (an fp16 graph's, on a GPU EP, are converted on the host)."""
    return logits if logits.dtype == np.float32 else logits.astype(np.float32)


class SharedLayout:
    """kv.ModelRunner's shared-layout methods (the runner holds the state: `_kv`, `_host`, `capacity`,
    `_mask`, `_binding`, `_prefill_binding`, `_logits`)."""

    def reserve(self, positions: int) -> None:
        """Make room for `positions` cached positions now (shared layout), so no forward grows the cache."""
        pad = max(self.pad_rows, self.prefill_pad_rows)
        if self.shared and positions + pad > self.capacity:
            self._grow(positions + pad)

    def _grow(self, needed: int) -> None:
        import onnxruntime as ort  # lazy: importing the runtime (and `edgespec --help`) needs no onnxruntime

        cap = max(needed, 2 * self.capacity, CAPACITY_STEP)
        cap = -(-cap // CAPACITY_STEP) * CAPACITY_STEP
        if self.max_position:
            cap = max(needed, min(cap, self.max_position))
        shape = (1, self.kv_heads, cap, self.head_dim)
        old = self._kv
        if self.device == "cpu":
            host = [np.zeros(shape, dtype=self.kv_dtype) for _ in self.past_names]
            if old is not None:
                for h, o in zip(host, self._host):
                    h[:, :, :self.length] = o[:, :, :self.length]      # the one copy a growth costs
            self._host = host
            self._kv = [ort.OrtValue.ortvalue_from_numpy(h) for h in host]
        else:
            kv = []
            for i in range(len(self.past_names)):
                h = np.zeros(shape, dtype=self.kv_dtype)
                if old is not None:
                    h[:, :, :self.length] = old[i].numpy()[:, :, :self.length]
                kv.append(ort.OrtValue.ortvalue_from_numpy(h, self.device, 0))
            self._kv = kv
        self._mask = np.ones((1, cap), dtype=np.int64)
        self._binding = self._bind_kv(self.session)
        if self.prefill_session is not None:       # both graphs read and write the same KV buffers
            self._prefill_binding = self._bind_kv(self.prefill_session)
        self.capacity = cap

    def _bind_kv(self, session):
        io = session.io_binding()
        for past, present, value in zip(self.past_names, self.present_names, self._kv):
            io.bind_ortvalue_input(past, value)
            io.bind_ortvalue_output(present, value)
        return io

    def _run_shared(self, input_ids: np.ndarray, past: int, rows: int, on_prefill: bool) -> np.ndarray:
        s = input_ids.shape[1]
        end = past + s + (self.prefill_pad_rows if on_prefill else self.pad_rows)   # the pad rows' KV: never counted
        if end > self.capacity:
            self._grow(end)
        io = self._prefill_binding if on_prefill else self._binding
        io.bind_cpu_input("input_ids", input_ids)
        io.bind_cpu_input("attention_mask", self._mask[:, :end])
        if self.keeps_last:
            io.bind_cpu_input(LOGITS_TO_KEEP, keep_feed(rows, s))
        if rows > 16 or self._logits.shape[1] < rows:     # a prefill-sized buffer is not kept (see below)
            self._logits = np.empty((1, rows, self.vocab), dtype=self.logits_dtype)
        out = self._logits[:, :rows]
        # host memory: on a GPU EP only the rows asked for cross the bus
        io.bind_output("logits", "cpu", 0, self.logits_dtype, list(out.shape), out.ctypes.data)
        (self.prefill_session if on_prefill else self.session).run_with_iobinding(io)
        if rows > 16:
            self._logits = np.empty((1, 0, 0), self.logits_dtype)
        return as_float32(out[0])
