"""The shared KV layout (builder graphs, GroupQueryAttention): one preallocated buffer per
`past_key_values.*` input, [1, kv_heads, capacity, head_dim], bound once through IOBinding as both the
past input and the `present.*` output of every session that runs the graph (the graph's and its prefill
graph's). Attention reads positions [0, length) and writes the new ones in place: a forward moves only
input_ids, the attention mask and the logits, and a rollback is a change of `length`. The buffers live
on the EP's device (CPU memory, or CUDA/DirectML OrtValues on a GPU EP) and the logits are bound to host
memory, so on a GPU only the logits rows cross the bus (with `ids=True`, only the graph's greedy ids and
row sums: export/greedy_ids.py). Capacity grows by doubling (one copy of the cache per growth);
`reserve(n)` sizes it up front so a generation never grows it. One of kv.ModelRunner's layouts;
runtime/engine/kv_copy.py and kv_static.py are the others, with the same methods.
"""
from __future__ import annotations

import numpy as np

from edgespec.runtime.engine.kv_graph import LOGITS_SUM, LOGITS_TO_KEEP, NEXT_IDS, GraphSignature, as_float32, keep_feed

CAPACITY_STEP = 256
KEPT_LOGITS_ROWS = 16      # a logits buffer up to this many rows is kept for the next forward; a prefill's is not


class SharedLayout:
    """A KV cache in buffers that attention writes in place, on `device` ("cpu" or an EP's device name),
    at most `max_position` positions long where that is known."""

    def __init__(self, graph: GraphSignature, session, device: str = "cpu", max_position: int | None = None):
        self.graph = graph
        self.device = device
        self.max_position = max_position
        self.length = 0
        self.capacity = 0
        self.values: list = []          # one OrtValue per past input
        self.host: list[np.ndarray] = []        # on the CPU: the arrays those OrtValues wrap
        self.mask = np.ones((1, 0), dtype=np.int64)
        self.bindings = {session: None}     # session -> its IOBinding of the buffers (made at the first growth)
        self.logits = np.empty((1, 0, 0), graph.logits_dtype)
        self.session = session            # the graph's own session (an attached prefill graph's is another)
        self.plain_run = None             # RunOptions of an uncaptured run (kv_static.py), None: ORT's defaults

    def reset(self) -> None:
        """Empty the cache; the buffers are kept for re-use."""
        self.length = 0

    def crop(self, n: int) -> None:
        self.length = n

    def reserve(self, positions: int) -> None:
        """Make room for `positions` positions now (pad rows included), so no forward grows the cache."""
        if positions > self.capacity:
            self.grow(positions)

    def attach(self, session) -> None:
        """Let `session` (the prefill graph) read and write the same buffers."""
        self.bindings[session] = self.bind(session) if self.values else None

    def arrays(self) -> list[np.ndarray]:
        """The cached positions, one array per past input (views on the CPU, copies from a device)."""
        if self.device == "cpu":
            return [h[:, :, :self.length] for h in self.host]
        return [v.numpy()[:, :, :self.length] for v in self.values]

    def grow(self, needed: int, exact: bool = False) -> None:
        """Room for `needed` positions: doubled and rounded up to CAPACITY_STEP (exact: `needed` itself)."""
        import onnxruntime as ort  # lazy: importing the runtime (and `edgespec --help`) needs no onnxruntime

        cap = max(needed, 2 * self.capacity, CAPACITY_STEP)
        cap = needed if exact else -(-cap // CAPACITY_STEP) * CAPACITY_STEP
        if self.max_position:
            cap = max(needed, min(cap, self.max_position))
        shape = (1, self.graph.kv_heads, cap, self.graph.head_dim)
        host = [np.zeros(shape, dtype=self.graph.kv_dtype) for _ in self.graph.past_names]
        for h, old in zip(host, self.arrays()):
            h[:, :, :self.length] = old      # the one copy a growth costs
        if self.device == "cpu":
            self.host = host
            self.values = [ort.OrtValue.ortvalue_from_numpy(h) for h in host]
        else:
            self.values = [ort.OrtValue.ortvalue_from_numpy(h, self.device, 0) for h in host]
        self.mask = np.ones((1, cap), dtype=np.int64)
        self.bindings = {session: self.bind(session) for session in self.bindings}
        self.capacity = cap

    def bind(self, session):
        io = session.io_binding()
        for past, present, value in zip(self.graph.past_names, self.graph.present_names, self.values):
            io.bind_ortvalue_input(past, value)
            io.bind_ortvalue_output(present, value)
        return io

    def run(self, session, input_ids: np.ndarray, rows: int, pad_rows: int, ids: bool = False):
        """Logits [rows, V] of `input_ids` [1, s] after the cache, on `session` (the graph's or an attached
        one); the cache grows by s (the pad rows' KV is written beyond it, never counted). ids=True:
        (the graph's greedy ids [rows], its row sums [rows]) instead, the logits left where they were
        computed (export/greedy_ids.py)."""
        s = input_ids.shape[1]
        end = self.length + s + pad_rows
        if end > self.capacity:
            self.grow(end)
        io = self.bindings[session]
        io.bind_cpu_input("input_ids", input_ids)
        io.bind_cpu_input("attention_mask", self.mask[:, :end])
        if self.graph.keeps_last:
            io.bind_cpu_input(LOGITS_TO_KEEP, keep_feed(rows, s))
        if ids:           # every head output is bound at every run: none is left pointing at a freed buffer
            picked, sums = np.empty((1, rows), np.int64), np.empty((1, rows), np.float32)
            io.bind_output(NEXT_IDS, "cpu", 0, np.int64, [1, rows], picked.ctypes.data)
            io.bind_output(LOGITS_SUM, "cpu", 0, np.float32, [1, rows], sums.ctypes.data)
            io.bind_output("logits", self.device)     # not copied: it stays where the graph computed it
            session.run_with_iobinding(io, self.plain_run)
            self.length += s
            return picked[0], sums[0]
        if self.graph.has_greedy_ids and session is self.session:     # where an ids run bound them
            io.bind_output(NEXT_IDS, self.device)
            io.bind_output(LOGITS_SUM, self.device)
        if rows > KEPT_LOGITS_ROWS or self.logits.shape[1] < rows:
            self.logits = np.empty((1, rows, self.graph.vocab), dtype=self.graph.logits_dtype)
        out = self.logits[:, :rows]
        # host memory: on a GPU EP only the rows asked for cross the bus
        io.bind_output("logits", "cpu", 0, self.graph.logits_dtype, list(out.shape), out.ctypes.data)
        session.run_with_iobinding(io, self.plain_run)
        if rows > KEPT_LOGITS_ROWS:
            self.logits = np.empty((1, 0, 0), self.graph.logits_dtype)
        self.length += s
        return as_float32(out[0])
