"""A model runner over one ORT session: feeds by name and owns the KV cache.

- `forward(ids)` runs the model on `ids` after everything already cached and returns the logits
  of those positions, [len(ids), V] (valid until this runner's next forward).
  With an empty cache this is the prefill: one forward over the whole prompt.
- `crop(n)` keeps the first n cached positions; `reset()` empties the cache.
- With a prefill graph (export/prefill_graph.py; runtime/engine/kv_prefill.py), a prompt of PREFILL_GRAPH_TOKENS or
  more runs on it (`prefill_graph_for`); `prefill_graph_rows` counts the leading positions it computed,
  which prefix reuse may keep (runtime/engine/prefix.py) where the prefill graph is chunk-invariant on this
  machine (`check_prefill_chunks`). A deferred prefill graph (`prefill_factory`) is built for the first
  prompt that needs it (`build_prefill_graph`).
- Each forward's wall time (ms) is added to `time_ms` / `last_ms`.

A runner is a few small objects: what its graph declares (`graph`, runtime/engine/kv_graph.py), the KV cache in
one of two layouts behind one interface (`kv`: reset, crop, reserve, attach, arrays, run), its optional
prefill graph (`prefill`, runtime/engine/kv_prefill.py) and its counters (`counts`). The layout is chosen from
the graph's metadata (`edgespec.kv_cache`, written at export):

- **shared** (builder graphs, GroupQueryAttention; runtime/engine/kv_shared.py): one buffer per past input,
  bound as both past and present, written in place by attention; a rollback (`crop`) is a change of
  `length`.
- **copy** (optimum graphs; runtime/engine/kv_copy.py): the `present.*` outputs (past + new, concatenated by
  the graph) become the next call's `past_key_values.*` inputs as NumPy arrays; a crop is a slice, made
  contiguous at the next forward.
"""
from __future__ import annotations

import threading
import time
from typing import Callable, Sequence

import numpy as np

from edgespec.errors import GenerationError
from edgespec.runtime.engine.kv_copy import CopyLayout
from edgespec.runtime.engine.kv_graph import (KV_KEY, LOGITS_TO_KEEP, MIN_TOKENS_KEY, PAD_ROWS_KEY,  # noqa: F401 (exported)
                                       ForwardCounts, GraphSignature)
from edgespec.runtime.engine.kv_prefill import AUTO_PREFILL_GRAPH_TOKENS, PREFILL_GRAPH_TOKENS, PrefillGraph  # noqa: F401
from edgespec.runtime.engine.kv_shared import SharedLayout
from edgespec.runtime.engine.kv_static import StaticLayout, captures, run_options
from edgespec.runtime.engine.placement import CPU, DEVICE
from edgespec.runtime.engine.probes import check_device_session, prefill_chunks_exact


def default_feeds(session) -> dict:
    """Inputs a plain caller leaves at their neutral value: `logits_to_keep` = 0 (every position)."""
    return {LOGITS_TO_KEEP: np.zeros(1, dtype=np.int64)} if any(i.name == LOGITS_TO_KEEP for i in
                                                                  session.get_inputs()) else {}


def _read(part: str, name: str) -> property:
    """A read-only attribute of the runner that is `name` of its `part` (graph, kv, prefill, counts)."""
    return property(lambda self: getattr(getattr(self, part), name), doc=f"`self.{part}.{name}`")


class ModelRunner:
    """Runs a causal LM exported with past inputs (docs/architecture.md, "The target graph").

    `kv="copy"` forces the copying layout on a graph that allows sharing (for comparisons).
    `min_tokens`: the forward width, shorter forwards padded to it (with their last id, then dropped);
    None takes the width the graph declares (`edgespec.min_forward_tokens`) where `exact`, else 1.
    `graph_argmax`: greedy forwards read the graph's argmax (None: off the CPU EP; forward's `greedy`).
    `static_length`: a shared cache of this many positions whose steps run from fixed buffers, captured as
    CUDA graphs where the session was made to (runtime/engine/kv_static.py); None: the shared layout.
    `exact=False` (the drafter) skips the declared padding: the drafter's logits only steer proposals,
    verification reads the target's. On a non-CPU EP an exact runner's 1-token forwards are padded to
    2 where they compute other bits (runtime/engine/probes.py)."""

    pending = False            # built (a DeferredRunner is pending until its first forward)
    session_info = None        # sessions.SessionInfo, set by whoever created the session
    shared_layout, copy_layout = SharedLayout, CopyLayout      # the layout classes use_layout makes

    past_names, vocab, keeps_last = _read("graph", "past_names"), _read("graph", "vocab"), _read("graph", "keeps_last")
    pad_rows, extra_outputs = _read("graph", "pad_rows"), _read("graph", "extra_outputs")
    length, capacity = _read("kv", "length"), _read("kv", "capacity")
    prefill_session, prefill_pad_rows = _read("prefill", "session"), _read("prefill", "pad_rows")
    prefill_from, prefill_pending = _read("prefill", "from_tokens"), _read("prefill", "pending")
    prefill_chunks_exact, prefill_graph_rows = _read("prefill", "chunks_exact"), _read("prefill", "rows")
    time_ms, last_ms = _read("counts", "time_ms"), _read("counts", "last_ms")
    forwards, tokens_fed = _read("counts", "forwards"), _read("counts", "tokens_fed")

    def __init__(self, session, role: str = "model", max_position: int | None = None, exact: bool = True,
                 head_dim: int | None = None, kv: str = "auto", prefill_session=None,
                 prefill_factory: Callable[[], object] | None = None, prefill_from: int = PREFILL_GRAPH_TOKENS,
                 remember_chunks: Callable[[Callable[[], bool]], bool] | None = None, min_tokens: int | None = None,
                 graph_argmax: bool | None = None, static_length: int | None = None):
        if kv not in ("auto", "copy"):
            raise ValueError(f"kv must be 'auto' or 'copy', got {kv!r}")
        if min_tokens is not None and int(min_tokens) < 1:
            raise ValueError(f"min_tokens must be at least 1, got {min_tokens!r}")
        self.session = session
        self.role = role
        self.max_position = max_position
        self.graph = GraphSignature(session, role, head_dim)
        declared = self.graph.declared_min_tokens if exact else 1
        self.min_tokens = declared if min_tokens is None else int(min_tokens)
        # export/prefill_graph.py: the same graph computing in fp32, for forwards of PREFILL_GRAPH_TOKENS or
        # more; given (prefill_session) or built for the first long prompt (prefill_factory: a session)
        self.prefill = PrefillGraph(role, self.graph.pad_rows, prefill_factory if prefill_session is None else None,
                                    prefill_from, remember_chunks)
        self.counts = ForwardCounts()
        self.static_length = static_length
        session_ep = (session.get_providers() or [CPU])[0]
        self.device = DEVICE.get(session_ep, "cpu")     # where shared KV buffers live
        # greedy forwards read the graph's own argmax (export/greedy_ids.py) off the CPU EP, where the
        # logits would cross a bus; on the CPU, NumPy's argmax of the logits is as fast (2026-11-28,
        # docs/gpu.md). graph_argmax=True forces it where the graph has it (tests).
        self.graph_argmax = self.graph.has_greedy_ids and (session_ep != CPU if graph_argmax is None
                                                           else bool(graph_argmax))
        self.use_layout(kv == "auto" and self.graph.declares_shared)      # sets self.kv
        if session_ep != CPU:      # what this EP's kernels do, measured (runtime/engine/probes.py)
            self.min_tokens = check_device_session(self, session_ep, exact)
        if prefill_session is not None:
            self.attach_prefill_graph(prefill_session)

    # ------------------------------------------------------------------ state
    @property
    def captures(self) -> bool:
        """Whether this runner's steps may be captured as CUDA graphs (runtime/engine/kv_static.py)."""
        return bool(getattr(self.kv, "capture", False))

    @property
    def shared(self) -> bool:
        """Whether the cache is in the shared layout (runtime/engine/kv_shared.py)."""
        return isinstance(self.kv, SharedLayout)

    def use_layout(self, shared: bool) -> None:
        """Hold the cache in the shared layout (buffers on `device`) or the copy layout, empty."""
        capture = captures(self.session)
        if shared and self.static_length:
            self.kv: CopyLayout | SharedLayout = StaticLayout(self.graph, self.session, self.device, self.max_position,
                                                              self.static_length, capture=capture)
        elif shared:
            self.kv = self.shared_layout(self.graph, self.session, self.device, self.max_position)
        else:
            self.kv = self.copy_layout(self.graph)
        if capture and not isinstance(self.kv, StaticLayout):
            self.kv.plain_run = run_options(-1)       # a session that captures runs uncaptured only when told
        if self.prefill.session is not None:       # both graphs read and write the same cache
            self.kv.attach(self.prefill.session)
        self.prefill.keep(0)

    def reset(self) -> None:
        """Empty the cache (the next forward is a prefill). Shared buffers are kept for re-use."""
        self.kv.reset()
        self.prefill.keep(0)

    def crop(self, n: int) -> None:
        """Keep the first n cached positions (n <= length)."""
        if n < 0 or n > self.length:
            raise ValueError(f"cannot crop a {self.length}-position cache to {n}")
        if n != self.length:
            self.kv.crop(n)
            self.prefill.keep(n)

    def reserve(self, positions: int) -> None:
        """Make room for `positions` cached positions now (shared layout), so no forward grows the cache."""
        self.kv.reserve(positions + max(self.graph.pad_rows, self.prefill.pad_rows))

    def cached_kv(self) -> list[np.ndarray]:
        """The cached positions' keys and values, one array [1, kv_heads, length, head_dim] per past input."""
        return self.kv.arrays()

    # ------------------------------------------------------------------ running
    def forward(self, ids: Sequence[int] | np.ndarray, last: int | None = None, pad: bool = True,
                prefill_graph: bool | None = None, greedy: bool = False) -> np.ndarray:
        """Logits [len(ids), V] for `ids` appended after the cached positions; the cache grows by len(ids).
        `last=k`: only the last k positions' logits [k, V] (a prefill needs one row). A graph with a
        `logits_to_keep` input computes only those rows, at least `min_tokens` of them so that the head
        runs on the same kernel path as a verify forward; any other graph computes all and slices.
        pad=False: a short forward takes the graph's own (fast) path, unpadded. prefill_graph: run on the
        prefill graph (True), on the graph (False), or by length, PREFILL_GRAPH_TOKENS or more (None).
        greedy=True: each row's argmax (int64 [rows]) instead of the rows: the graph's own where it has
        the greedy ids (export/greedy_ids.py: on a GPU only ids cross the bus), else the host's."""
        if prefill_graph is None:
            prefill_graph = self.prefill_graph_for(len(ids))
        if pad and 0 < len(ids) < self.min_tokens:  # pad with the last id, then drop it: causal, so exact
            flat = np.asarray(ids, dtype=np.int64).ravel()
            extra = self.min_tokens - flat.size
            rows = self.forward(np.concatenate([flat, np.repeat(flat[-1:], extra)]), prefill_graph=prefill_graph,
                                greedy=greedy)
            self.crop(self.length - extra)
            rows = rows[:flat.size]
            return rows if last is None else rows[-last:]
        s = len(ids)
        past = self.length
        input_ids = np.asarray(ids, dtype=np.int64).reshape(1, s)
        rows = s if last is None or not self.keeps_last else min(s, max(int(last), self.min_tokens if pad else 1))
        on_prefill = bool(prefill_graph) and self.prefill.session is not None
        session, pad_rows = (self.prefill.session, self.prefill.pad_rows) if on_prefill else \
            (self.session, self.graph.pad_rows)
        graph_ids = greedy and not on_prefill and self.graph_argmax
        t0 = time.perf_counter()
        out = self.kv.run(session, input_ids, rows, pad_rows, ids=graph_ids)
        # (the graph's ids, its row sums) or (logits, logits): the second is what NaN and inf show in
        picked, checked = out if graph_ids else (out, out)
        if last is not None:
            picked, checked = picked[-last:], checked[-last:]
        self.counts.add((time.perf_counter() - t0) * 1e3, s)
        if on_prefill:
            self.prefill.ran(past, self.length)
        if not np.isfinite(checked.sum()):   # one float32 reduction (~0.1 ms at 150k x 5): NaN and inf propagate
            raise GenerationError(f"the {self.role} graph returned NaN or inf logits (a corrupt or mismatched "
                                  "model file, or an EP numerics problem); no text was produced from them")
        return np.argmax(picked, axis=-1) if greedy and not graph_ids else picked

    def run_extra(self, names: Sequence[str]) -> list[np.ndarray]:
        """Run a 1-token forward on a fresh cache just to read constant outputs (e.g. the drafter's
        `index_map`); the runner's cache is left untouched."""
        feeds = self.graph.step_feeds(np.zeros((1, 1), dtype=np.int64), 0, 1, self.graph.pad_rows)
        feeds.update((name, self.graph.empty_past()) for name in self.graph.past_names)
        return self.session.run(list(names), feeds, run_options(-1) if captures(self.session) else None)

    # ------------------------------------------------------------------ the prefill graph
    def attach_prefill_graph(self, session) -> None:
        """Run long forwards on `session`, which must take and give what the graph does."""
        self.prefill.attach(session, self.session)
        self.kv.attach(session)

    def build_prefill_graph(self) -> float:
        """Build a deferred prefill graph and check it (kv_prefill.PrefillGraph.build); milliseconds."""
        return self.prefill.build(self)

    def prefill_graph_for(self, prompt_tokens: int) -> bool:
        """Whether a prompt of this many tokens is prefilled on the prefill graph, built yet or not."""
        return self.prefill.takes(prompt_tokens)

    def check_prefill_chunks(self) -> bool:
        """The prefill graph's chunk verdict (kv_prefill.PrefillGraph.check_chunks); a probe leaves the
        cache empty."""
        return self.prefill.check_chunks(self.probe_prefill_chunks)

    def probe_prefill_chunks(self, tokens: int = 16) -> bool:
        """runtime/probes.prefill_chunks_exact on this runner. Leaves the cache empty."""
        return prefill_chunks_exact(self, tokens)


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
