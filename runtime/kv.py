"""A model runner over one ORT session: feeds by name and owns the KV cache.

- `forward(ids)` runs the model on `ids` after everything already cached and returns the logits
  of those positions, [len(ids), V] (valid until this runner's next forward).
  With an empty cache this is the prefill: one forward over the whole prompt.
- `crop(n)` keeps the first n cached positions; `reset()` empties the cache.
- With a prefill graph (export/prefill_graph.py; runtime/kv_prefill.py), a prompt of PREFILL_GRAPH_TOKENS or more runs on it
  (`prefill_graph_for`); `prefill_graph_rows` counts the leading positions it computed, which prefix
  reuse may keep (runtime/prefix.py) where the prefill graph is chunk-invariant on this machine
  (`check_prefill_chunks`). A deferred prefill graph (`prefill_factory`) is built for the first prompt
  that needs it (`build_prefill_graph`).
- Each forward's wall time (ms) is added to `time_ms` / `last_ms`.

Two KV layouts, chosen from the graph's metadata (`edgespec.kv_cache`, written at export):

- **shared** (builder graphs, GroupQueryAttention; runtime/kv_shared.py): one buffer per past input,
  bound as both past and present, written in place by attention; a rollback (`crop`) is a change of
  `length`.
- **copy** (optimum graphs): the `present.*` outputs (past + new, concatenated by the graph) become
  the next call's `past_key_values.*` inputs as NumPy arrays; a crop is a slice, made contiguous
  at the next forward.
"""
from __future__ import annotations

import threading
import time
from typing import Callable, Sequence

import numpy as np

from edgespec.errors import BundleError, GenerationError
from edgespec.runtime.placement import CPU, DEVICE
from edgespec.runtime.kv_prefill import PAD_ROWS_KEY, PrefillGraph, graph_meta
from edgespec.runtime.kv_shared import LOGITS_TO_KEEP, SharedLayout, as_float32, keep_feed
from edgespec.runtime.probes import check_device_session

_PAST_PREFIX = "past_key_values."
_PRESENT_PREFIX = "present."
_ORT_TO_NUMPY = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(double)": np.float64,
                 "tensor(bfloat16)": np.float32}
KV_KEY = "edgespec.kv_cache"
MIN_TOKENS_KEY = "edgespec.min_forward_tokens"
# Forwards this long or longer run on the prefill graph where there is one. The int4 1.5B, 2-core Xeon,
# prefill of 64 / 128 / 512 tokens: 0.81 / 1.56 / 6.51 s on the graph, 0.77 / 1.32 / 5.23 s on the
# prefill graph; a 5-token forward 113 against 310 ms (export/prefill_graph.py).
PREFILL_GRAPH_TOKENS = 96     # above any verify forward (tests/test_prefill_graph.py checks it)
# prefill_graph="auto" takes prompts this long: a deferred build (1.1-1.3 s, the int4 1.5B's weights
# prepacked again) is then about what the prefill graph saves on its first prompt (2.5 ms a token on the
# 2-core Xeon). One threshold whether built yet or not, so that a prompt's function never depends on
# what the decoder ran before.
AUTO_PREFILL_GRAPH_TOKENS = 512


def default_feeds(session) -> dict:
    """Inputs a plain caller leaves at their neutral value: `logits_to_keep` = 0 (every position)."""
    return {LOGITS_TO_KEEP: np.zeros(1, dtype=np.int64)} if any(i.name == LOGITS_TO_KEEP for i in
                                                                  session.get_inputs()) else {}


class ModelRunner(SharedLayout, PrefillGraph):
    """Runs a causal LM exported with past inputs (docs/architecture.md, "The target graph").

    `kv="copy"` forces the copying layout on a graph that allows sharing (for comparisons).
    `exact=False` (the drafter) skips the 1-token padding a quantized graph asks for: the drafter's
    logits only steer proposals, verification reads the target's."""

    pending = False            # built (a DeferredRunner is pending until its first forward)
    session_info = None        # sessions.SessionInfo, set by whoever created the session

    def __init__(self, session, role: str = "model", max_position: int | None = None, exact: bool = True,
                 head_dim: int | None = None, kv: str = "auto", prefill_session=None,
                 prefill_factory: Callable[[], object] | None = None, prefill_from: int = PREFILL_GRAPH_TOKENS,
                 remember_chunks: Callable[[Callable[[], bool]], bool] | None = None):
        self.session = session
        # export/prefill_graph.py: the same graph computing in fp32, for forwards of PREFILL_GRAPH_TOKENS or
        # more; given (prefill_session) or built for the first long prompt (prefill_factory: a session)
        self.prefill_session = None
        self._prefill_factory = prefill_factory if prefill_session is None else None
        self.prefill_from = max(int(prefill_from), PREFILL_GRAPH_TOKENS)   # the shortest prompt it takes
        self._remember_chunks = remember_chunks     # (probe) -> verdict, probing only where none is known
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
        # export/last_logits.py: graphs that can emit the last k positions' logits only (prefill).
        self.keeps_last = LOGITS_TO_KEEP in inputs
        shape = inputs[self.past_names[0]].shape          # [batch, kv_heads, past, head_dim]
        self.kv_heads = int(shape[1])
        self.head_dim = int(shape[3]) if isinstance(shape[3], int) else int(head_dim or 0)
        if not self.head_dim:
            raise BundleError(f"{role} graph has a symbolic KV head dimension and none was given")
        self.kv_dtype = _ORT_TO_NUMPY.get(inputs[self.past_names[0]].type, np.float32)
        self.vocab = session.get_outputs()[outputs.index("logits")].shape[-1]
        self.output_names = ["logits", *self.present_names]
        meta = graph_meta(session)
        # A quantized graph may declare that its 1-token forwards compute other logits (attention's 1-query
        # path, amplified by int8 activations: docs/quantization.md); forward() then pads them so every
        # forward computes the same function. A padded-attention graph (PAD_ROWS_KEY) needs no padding.
        self.min_tokens = max(1, int(meta.get(MIN_TOKENS_KEY, 1))) if exact else 1
        self.pad_rows = max(0, int(meta.get(PAD_ROWS_KEY, 0)))
        self.prefill_pad_rows = self.pad_rows      # the prefill graph's own (attach_prefill_graph)
        if kv not in ("auto", "copy"):
            raise ValueError(f"kv must be 'auto' or 'copy', got {kv!r}")
        self.shared = kv == "auto" and meta.get(KV_KEY) == "shared"
        self.logits_dtype = _ORT_TO_NUMPY.get(session.get_outputs()[outputs.index("logits")].type, np.float32)
        self.extra_outputs = [n for n in outputs if n not in self.output_names]
        self.time_ms = 0.0           # totals over the runner's life (callers book per-generation time)
        self.last_ms = 0.0
        self.forwards = 0
        self.tokens_fed = 0
        self.capacity = 0
        session_ep = (session.get_providers() or [CPU])[0]
        self.device = DEVICE.get(session_ep, "cpu")
        self._binding = None
        self._prefill_binding = None
        self.prefill_chunks_exact = False     # check_prefill_chunks (run where the prefill graph is built)
        self._kv: list | None = None     # shared layout: one OrtValue per past input (and _host, its arrays on CPU)
        self._host: list = []
        self._logits = np.empty((1, 0, 0), self.logits_dtype)
        self.reset()
        if session_ep != CPU:      # what this EP's kernels do, measured (runtime/probes.py)
            check_device_session(self, session_ep, exact)
        if prefill_session is not None:
            self.attach_prefill_graph(prefill_session)

    # ------------------------------------------------------------------ state
    def reset(self) -> None:
        """Empty the cache (the next forward is a prefill). Shared buffers are kept for re-use."""
        if not self.shared:
            empty = np.zeros((1, self.kv_heads, 0, self.head_dim), dtype=self.kv_dtype)
            self.past = [empty] * len(self.past_names)
        self.length = 0
        self.prefill_graph_rows = 0

    def crop(self, n: int) -> None:
        """Keep the first n cached positions (n <= length)."""
        if n < 0 or n > self.length:
            raise ValueError(f"cannot crop a {self.length}-position cache to {n}")
        if n == self.length:
            return
        if not self.shared:
            self.past = [p[:, :, :n, :] for p in self.past]
        self.length = n
        self.prefill_graph_rows = min(self.prefill_graph_rows, n)

    # ------------------------------------------------------------------ running
    def forward(self, ids: Sequence[int] | np.ndarray, last: int | None = None, pad: bool = True,
                prefill_graph: bool | None = None) -> np.ndarray:
        """Logits [len(ids), V] for `ids` appended after the cached positions; the cache grows by len(ids).
        `last=k`: only the last k positions' logits [k, V] (a prefill needs one row). A graph with a
        `logits_to_keep` input computes only those rows, at least `min_tokens` of them so that the head
        runs on the same kernel path as a verify forward; any other graph computes all and slices.
        pad=False: a short forward takes the graph's own (fast) path, unpadded. prefill_graph: run on the
        prefill graph (True), on the graph (False), or by length, PREFILL_GRAPH_TOKENS or more (None)."""
        if prefill_graph is None:
            prefill_graph = self.prefill_graph_for(len(ids))
        if pad and 0 < len(ids) < self.min_tokens:  # pad with the last id, then drop it: causal, so exact
            flat = np.asarray(ids, dtype=np.int64).ravel()
            extra = self.min_tokens - flat.size
            logits = self.forward(np.concatenate([flat, np.repeat(flat[-1:], extra)]), prefill_graph=prefill_graph)
            self.crop(self.length - extra)
            logits = logits[:flat.size]
            return logits if last is None else logits[-last:]
        s = len(ids)
        past = self.length
        input_ids = np.asarray(ids, dtype=np.int64).reshape(1, s)
        rows = s if last is None or not self.keeps_last else min(s, max(int(last), self.min_tokens if pad else 1))
        on_prefill = bool(prefill_graph) and self.prefill_session is not None
        t0 = time.perf_counter()
        run = self._run_shared if self.shared else self._run_copy
        logits = run(input_ids, past, rows, on_prefill)
        if last is not None:
            logits = logits[-last:]
        self.last_ms = (time.perf_counter() - t0) * 1e3
        self.time_ms += self.last_ms
        self.forwards += 1
        self.tokens_fed += s
        self.length = past + s
        if on_prefill and past == self.prefill_graph_rows:
            self.prefill_graph_rows = self.length
        if not np.isfinite(logits.sum()):   # one float32 reduction (~0.1 ms at 150k x 5): NaN and inf propagate
            raise GenerationError(f"the {self.role} graph returned NaN or inf logits (a corrupt or mismatched "
                                  "model file, or an EP numerics problem); no text was produced from them")
        return logits

    def _run_copy(self, input_ids: np.ndarray, past: int, rows: int, on_prefill: bool) -> np.ndarray:
        s = input_ids.shape[1]
        pad = self.prefill_pad_rows if on_prefill else self.pad_rows
        feeds = {"input_ids": input_ids, "attention_mask": np.ones((1, past + s + pad), dtype=np.int64)}
        if self.keeps_last:
            feeds[LOGITS_TO_KEEP] = keep_feed(rows, s)
        if self.has_position_ids:
            feeds["position_ids"] = np.arange(past, past + s, dtype=np.int64).reshape(1, s)
        for name, arr in zip(self.past_names, self.past):
            # A cropped cache is a strided view; ORT needs C-contiguous input (one copy, only after a crop).
            feeds[name] = arr if arr.flags.c_contiguous else np.ascontiguousarray(arr)
        out = (self.prefill_session if on_prefill else self.session).run(self.output_names, feeds)
        self.past = [p[:, :, :past + s] for p in out[1:]] if pad else out[1:]
        return as_float32(out[0][0])

    def run_extra(self, names: Sequence[str]) -> list[np.ndarray]:
        """Run a 1-token forward on a fresh cache just to read constant outputs (e.g. the drafter's
        `index_map`); the runner's cache is left untouched."""
        feeds = {"input_ids": np.zeros((1, 1), dtype=np.int64),
                 "attention_mask": np.ones((1, 1 + self.pad_rows), dtype=np.int64)}
        if self.has_position_ids:
            feeds["position_ids"] = np.zeros((1, 1), dtype=np.int64)
        feeds.update(default_feeds(self.session))
        empty = np.zeros((1, self.kv_heads, 0, self.head_dim), dtype=self.kv_dtype)
        for name in self.past_names:
            feeds[name] = empty
        return self.session.run(list(names), feeds)


class DeferredRunner:
    """A ModelRunner whose ORT session is built at its first forward, not before.

    The decoder's drafter (SpeculativeDecoder(defer_drafter=True), the default on the CPU EP): the
    first token needs the target alone, so building the drafter's session (graph load and weight
    prepacking, about 0.3 s for the int4 0.5B) after it moves that time off an app's time to first
    token. Until it is built it is what it will be then, an empty cache: `length` and `tokens_fed`
    are 0, `reset()` and `crop(0)` do nothing, `max_position` is the manifest's. Any other attribute
    (`forward`, `run_extra`, ...) builds it first; `build()` does so explicitly and returns the
    milliseconds it took (0.0 when it was built already). Thread-safe; errors are `make`'s, raised
    where it is first used and again at each later use."""

    def __init__(self, make: Callable[[], "ModelRunner"], max_position: int | None, providers: list[str]):
        self._make = make
        self._runner: ModelRunner | None = None
        self._lock = threading.Lock()
        self.max_position = max_position
        self.providers = providers       # what the session is asked for (the CPU EP: what it gets)

    @property
    def pending(self) -> bool:
        return self._runner is None

    def build(self) -> float:
        with self._lock:
            if self._runner is not None:
                return 0.0
            t0 = time.perf_counter()
            self._runner = self._make()
            return (time.perf_counter() - t0) * 1e3

    @property
    def runner(self) -> "ModelRunner":
        if self._runner is None:
            self.build()
        return self._runner

    @property
    def length(self) -> int:
        return 0 if self._runner is None else self._runner.length

    @property
    def tokens_fed(self) -> int:
        return 0 if self._runner is None else self._runner.tokens_fed

    def reset(self) -> None:
        if self._runner is not None:
            self._runner.reset()

    def crop(self, n: int) -> None:
        if self._runner is not None:
            self._runner.crop(n)
        elif n:
            raise ValueError(f"cannot crop an empty cache to {n}")

    def __getattr__(self, name: str):        # anything else is the built runner's
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.runner, name)
