"""Where ONNX Runtime placed a graph's nodes, and where a shared KV cache may live because of it.

The shared KV layout (runtime/engine/kv.py) binds one buffer per layer as both `past_key_values.*` and
`present.*`, and the attention node writes the new positions into it in place. That is sound only when
the node that writes the cache runs on the EP whose memory holds the buffer: under `ep="cuda"` an fp32
builder graph's GroupQueryAttention has no CUDA kernel and runs on the CPU EP, so ORT hands it host
copies of CUDA buffers, it writes into the copies, and the cache on the GPU is garbage from the second
step on, with no error (seen on an H100: docs/results.md).

`read_placement(session)` asks ORT which EP runs each node: `InferenceSession.get_provider_graph_assignment_info()`
(ORT 1.24+, with the session config entry RECORD_KEY set at creation: runtime/engine/sessions.py sets it for
every non-CPU session). Older builds give None, and the caller relies on its numeric probe
(kv.ModelRunner.probe_shared_layout) alone. `kv_placement(nodes, ...)` is the decision, a pure function
that tests feed: the EP every KV-writing node runs on (the shared buffers then live in that EP's memory),
or the reason there is none (the copy layout is then the sound one).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

RECORD_KEY = "session.record_ep_graph_assignment_info"
# Contrib and standard ops that read past_key_values and write present.* in place or by concatenation.
KV_WRITERS = frozenset({"GroupQueryAttention", "MultiHeadAttention", "Attention", "DecoderMaskedMultiHeadAttention",
                        "PagedAttention", "SparseAttention"})
CPU = "CPUExecutionProvider"
# OrtValue device for an EP's shared KV buffers; EPs not listed take host memory (ORT copies per run)
DEVICE = {"CUDAExecutionProvider": "cuda", "DmlExecutionProvider": "dml", "ROCMExecutionProvider": "rocm"}


@dataclass(frozen=True)
class PlacedNode:
    name: str
    op_type: str
    ep: str


@dataclass(frozen=True)
class KVPlacement:
    """`ep`: the EP whose memory holds shared KV buffers (None: no shared layout); `reason`: why not, or
    what the user should know (a one-line message; None when nothing is worth saying)."""
    ep: str | None
    reason: str | None = None


def read_placement(session) -> list[PlacedNode] | None:
    """Each node of `session`'s optimised graph with the EP that runs it; None where this ORT build
    cannot say (older than the API, or the session was created without RECORD_KEY)."""
    get = getattr(session, "get_provider_graph_assignment_info", None)
    if get is None:
        return None
    try:
        groups = get()
    except Exception:  # noqa: BLE001 - ORT raises its own types when recording was not enabled
        return None
    nodes = [PlacedNode(n.name, n.op_type, g.ep_name) for g in groups for n in g.get_nodes()]
    return nodes or None


def kv_placement(nodes: Iterable[PlacedNode] | None, session_ep: str, role: str = "model") -> KVPlacement:
    """Where a shared KV cache is sound for a session whose first EP is `session_ep`, given its node
    placement (None: unknown). The KV-writing nodes must all run on one EP; the buffers then live in
    its memory. A graph whose attention fell back to another EP than the session's says so (slow, but
    correct), naming the fix."""
    if nodes is None:
        return KVPlacement(session_ep)            # unknown: the numeric probe decides (kv.py)
    writers = [n for n in nodes if n.op_type in KV_WRITERS]
    eps = sorted({n.ep for n in writers})
    if not writers:
        return KVPlacement(None, f"{role}: no attention node writes the KV cache in this graph; the cache is "
                                 "copied between steps")
    if len(eps) > 1:
        return KVPlacement(None, f"{role}: the attention nodes run on {', '.join(eps)}; the KV cache is copied "
                                 "between steps (slow): export for the EP (edgespec export --ep ...)")
    if eps[0] != session_ep:
        op = writers[0].op_type
        short = session_ep.replace("ExecutionProvider", "").lower()
        return KVPlacement(eps[0], f"{role}: {op} runs on {eps[0]}, not {session_ep} (this graph's precision has "
                                   f"no {op} kernel there), so the KV cache stays in that EP's memory and every "
                                   f"layer's attention crosses the bus: export for the EP (edgespec export --ep "
                                   f"{short}) to run attention on it")
    return KVPlacement(eps[0])
