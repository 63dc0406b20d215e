"""A runner's prefill graph (export/prefill_graph.py): the same graph computing in fp32, for forwards of
PREFILL_GRAPH_TOKENS or more, given when the runner is made or built for the first long prompt that
needs it; `rows` counts the leading cached positions it computed, which prefix reuse may keep
(runtime/engine/prefix.py) where it is chunk-invariant on this machine (`check_chunks`).
"""
from __future__ import annotations

import time
import warnings
from typing import Callable

from edgespec.errors import BundleError, first_line
from edgespec.runtime.engine.kv_graph import PAD_ROWS_KEY, graph_io, graph_meta

# Forwards this long or longer run on the prefill graph where there is one. The int4 1.5B, 2-core Xeon,
# prefill of 64 / 128 / 512 tokens: 0.81 / 1.56 / 6.51 s on the graph, 0.77 / 1.32 / 5.23 s on the
# prefill graph; a 5-token forward 113 against 310 ms (export/prefill_graph.py).
PREFILL_GRAPH_TOKENS = 96     # above any verify forward (tests/test_prefill_graph.py checks it)
# prefill_graph="auto" takes prompts this long: a deferred build (1.1-1.3 s, the int4 1.5B's weights
# prepacked again) is then about what the prefill graph saves on its first prompt (2.5 ms a token on the
# 2-core Xeon). One threshold whether built yet or not, so that a prompt's function never depends on
# what the decoder ran before.
AUTO_PREFILL_GRAPH_TOKENS = 512


class PrefillGraph:
    """The prefill graph of one runner: its session (or the factory that builds it, `pending`), the
    shortest prompt it takes (`from_tokens`, at least PREFILL_GRAPH_TOKENS), the attention pad rows it
    feeds (`pad_rows`: the runner's graph's until a session is attached), its chunk verdict and the rows
    it computed. `remember_chunks(probe) -> verdict` probes only where no verdict is known for this
    machine (runtime/engine/verdicts.py)."""

    def __init__(self, role: str, pad_rows: int, factory: Callable[[], object] | None = None,
                 from_tokens: int = PREFILL_GRAPH_TOKENS,
                 remember_chunks: Callable[[Callable[[], bool]], bool] | None = None):
        self.role = role
        self.session = None
        self.factory = factory
        self.from_tokens = max(int(from_tokens), PREFILL_GRAPH_TOKENS)
        self.remember_chunks = remember_chunks
        self.pad_rows = pad_rows
        self.chunks_exact = False     # check_chunks (run where the prefill graph is built)
        self.rows = 0

    @property
    def pending(self) -> bool:
        return self.factory is not None

    def takes(self, prompt_tokens: int) -> bool:
        """Whether a prompt of this many tokens is prefilled on the prefill graph (all of it, also what
        prefix reuse leaves of it: the same function as a cold prefill), built yet or not."""
        return (self.session is not None or self.factory is not None) and prompt_tokens >= self.from_tokens

    def attach(self, session, graph_session) -> None:
        """Take `session`, which must take and give what `graph_session` (the runner's graph) does."""
        if graph_io(session) != graph_io(graph_session):
            raise BundleError(f"{self.role} prefill graph's inputs and outputs differ from its graph's")
        # made from the padded-attention graph where the bundle has one (export/prefill_graph.py), it may
        # pad attention where the graph the device plan runs does not: each forward feeds its own session's
        self.pad_rows = max(0, int(graph_meta(session).get(PAD_ROWS_KEY, 0)))
        self.session = session
        self.factory = None

    def build(self, runner) -> float:
        """Build a pending session, attach it to `runner` and check it (which leaves the cache empty);
        the milliseconds it took, 0.0 when none is pending. Where it cannot be built (memory, a damaged
        file) it says so once and long prompts run on the graph, as they did until then."""
        if self.factory is None:
            return 0.0
        t0 = time.perf_counter()
        make, self.factory = self.factory, None
        try:
            runner.attach_prefill_graph(make())
        except Exception as exc:     # noqa: BLE001 - ORT raises its own types; the decoder goes on without it
            first = first_line(exc)
            warnings.warn(f"the {self.role} prefill graph could not be built ({first}); long prompts run on the "
                          "graph", RuntimeWarning, stacklevel=4)
            return (time.perf_counter() - t0) * 1e3
        runner.check_prefill_chunks()
        return (time.perf_counter() - t0) * 1e3

    def check_chunks(self, probe: Callable[[], bool]) -> bool:
        """The chunk verdict: `remember_chunks`'s for this machine, else `probe()`'s; says once where the
        prefill graph is not chunk-invariant (prefix reuse then re-runs long prompts whole)."""
        self.chunks_exact = bool(self.remember_chunks(probe) if self.remember_chunks else probe())
        if not self.chunks_exact:
            warnings.warn("the prefill graph is not chunk-invariant on this machine: prefix reuse re-runs "
                          "long prompts whole", RuntimeWarning, stacklevel=4)
        return self.chunks_exact

    def ran(self, start: int, end: int) -> None:
        """A forward on the prefill graph wrote positions [start, end): they extend `rows` where they follow it."""
        if start == self.rows:
            self.rows = end

    def keep(self, n: int) -> None:
        """The cache was cropped to n positions (0: emptied)."""
        self.rows = min(self.rows, n)
