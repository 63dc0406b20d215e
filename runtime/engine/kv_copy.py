"""The copy KV layout (optimum graphs, and any graph a runner is asked to copy for): the `present.*`
outputs (past + new, concatenated by the graph) become the next forward's `past_key_values.*` inputs as
NumPy arrays; a crop is a slice, made contiguous at the next forward. One of kv.ModelRunner's two
layouts; runtime/engine/kv_shared.py is the other, with the same methods.
"""
from __future__ import annotations

import numpy as np

from edgespec.runtime.engine.kv_graph import LOGITS_SUM, NEXT_IDS, GraphSignature, as_float32


class CopyLayout:
    """A KV cache held as NumPy arrays, [1, kv_heads, length, head_dim] per past input."""

    capacity = 0           # nothing preallocated
    plain_run = None       # RunOptions of every run (kv_static.run_options(-1) on a session that captures)

    def __init__(self, graph: GraphSignature):
        self.graph = graph
        self.past: list[np.ndarray] = []
        self.reset()

    @property
    def length(self) -> int:
        return int(self.past[0].shape[2])

    def reset(self) -> None:
        self.past = [self.graph.empty_past()] * len(self.graph.past_names)

    def crop(self, n: int) -> None:
        if n != self.length:
            self.past = [p[:, :, :n, :] for p in self.past]

    def reserve(self, positions: int) -> None:
        """Nothing to do: each forward's outputs are the next one's cache."""

    def attach(self, session) -> None:
        """Nothing to bind: any session of the graph takes the arrays as inputs."""

    def arrays(self) -> list[np.ndarray]:
        """The cached positions, one array per past input."""
        return list(self.past)

    def run(self, session, input_ids: np.ndarray, rows: int, pad_rows: int, ids: bool = False):
        """Logits of `input_ids` [1, s] after the cache on `session` ([rows, V] where the graph keeps
        rows, else [s, V]); the cache grows by s (the pad rows' KV a padded-attention graph writes is
        dropped). ids=True: (the graph's greedy ids, its row sums) instead (export/greedy_ids.py)."""
        s, past = input_ids.shape[1], self.length
        feeds = self.graph.step_feeds(input_ids, past, rows, pad_rows)
        for name, arr in zip(self.graph.past_names, self.past):
            # A cropped cache is a strided view; ORT needs C-contiguous input (one copy, only after a crop).
            feeds[name] = arr if arr.flags.c_contiguous else np.ascontiguousarray(arr)
        heads = [NEXT_IDS, LOGITS_SUM] if ids else ["logits"]
        out = session.run(heads + self.graph.present_names, feeds, self.plain_run)
        kv = out[len(heads):]
        self.past = [p[:, :, :past + s] for p in kv] if pad_rows else kv
        return (out[0][0], out[1][0]) if ids else as_float32(out[0][0])
