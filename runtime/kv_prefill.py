"""The prefill graph of kv.ModelRunner (export/prefill_graph.py): the same graph computing in fp32, for
forwards of PREFILL_GRAPH_TOKENS or more, given when the runner is made or built for the first long
prompt (`build_prefill_graph`); `prefill_graph_rows` counts the leading positions it computed, which
prefix reuse may keep (runtime/prefix.py) where it is chunk-invariant on this machine
(`check_prefill_chunks`).
"""
from __future__ import annotations

import time
import warnings

from edgespec.errors import BundleError
from edgespec.runtime.probes import prefill_chunks_exact

# export/padded_attention.py: the graph appends this many copies of the last row to attention's queries
# (and drops them after), so it takes a mask that many positions longer and writes that many extra KV
# positions, which the runner never counts (the next forward overwrites them).
PAD_ROWS_KEY = "edgespec.attention_pad_rows"


def graph_meta(session) -> dict:
    """The graph's custom metadata (edgespec's keys)."""
    return getattr(session.get_modelmeta(), "custom_metadata_map", None) or {}


def graph_io(session) -> tuple:
    """The graph's inputs and outputs, by name and element type."""
    return ([(i.name, i.type) for i in session.get_inputs()], [(o.name, o.type) for o in session.get_outputs()])


class PrefillGraph:
    """kv.ModelRunner's prefill-graph methods (the runner holds the state: `prefill_session`,
    `_prefill_factory`, `prefill_from`, `prefill_pad_rows`, `prefill_chunks_exact`, `_remember_chunks`)."""

    def attach_prefill_graph(self, session) -> None:
        """Run long forwards on `session`, which must take and give what the graph does."""
        if graph_io(session) != graph_io(self.session):
            raise BundleError(f"{self.role} prefill graph's inputs and outputs differ from its graph's")
        # made from the padded-attention graph where the bundle has one (export/prefill_graph.py), it may
        # pad attention where the graph the device plan runs does not: each forward feeds its own session's
        self.prefill_pad_rows = max(0, int(graph_meta(session).get(PAD_ROWS_KEY, 0)))
        self.prefill_session = session
        if self._kv is not None:                  # both graphs read and write the same KV buffers
            self._prefill_binding = self._bind_kv(session)

    @property
    def prefill_pending(self) -> bool:
        return self._prefill_factory is not None

    def build_prefill_graph(self) -> float:
        """Build a deferred prefill graph's session and check it (which leaves the cache empty);
        returns the milliseconds it took, 0.0 when none is pending. Where it cannot be built (memory, a
        damaged file) it says so once and long prompts run on the graph, as they did until then."""
        if self._prefill_factory is None:
            return 0.0
        t0 = time.perf_counter()
        make, self._prefill_factory = self._prefill_factory, None
        try:
            self.attach_prefill_graph(make())
        except Exception as exc:     # noqa: BLE001 - ORT raises its own types; the decoder goes on without it
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            warnings.warn(f"the {self.role} prefill graph could not be built ({first}); long prompts run on the "
                          "graph", RuntimeWarning, stacklevel=3)
            return (time.perf_counter() - t0) * 1e3
        self.check_prefill_chunks()
        return (time.perf_counter() - t0) * 1e3

    def prefill_graph_for(self, prompt_tokens: int) -> bool:
        """Whether a prompt of this many tokens is prefilled on the prefill graph (all of it, also
        what prefix reuse leaves of it: the same function as a cold prefill, runtime/prefix.py), built
        yet or not."""
        has = self.prefill_session is not None or self._prefill_factory is not None
        return has and prompt_tokens >= self.prefill_from

    def check_prefill_chunks(self) -> bool:
        """`probe_prefill_chunks` (or the verdict `remember_chunks` knows for this machine: runtime/verdicts.py),
        saying once where the prefill graph is not chunk-invariant (prefix reuse then re-runs long prompts
        whole). A probe leaves the cache empty."""
        probe = self.probe_prefill_chunks
        self.prefill_chunks_exact = self._remember_chunks(probe) if self._remember_chunks else probe()
        if not self.prefill_chunks_exact:
            warnings.warn("the prefill graph is not chunk-invariant on this machine: prefix reuse re-runs "
                          "long prompts whole", RuntimeWarning, stacklevel=3)
        return self.prefill_chunks_exact

    def probe_prefill_chunks(self, tokens: int = 16) -> bool:
        """runtime/probes.prefill_chunks_exact on this runner; sets `prefill_chunks_exact`. Leaves the
        cache empty."""
        self.prefill_chunks_exact = prefill_chunks_exact(self, tokens)
        return self.prefill_chunks_exact
