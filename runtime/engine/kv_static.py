"""The static KV layout: the shared layout (kv_shared.py) with every input and output of a decode step at
a fixed address and of a fixed shape, which is what a CUDA graph needs to be replayed.

ONNX Runtime's CUDA EP captures a session's run as a CUDA graph (provider option `enable_cuda_graph`)
and replays it instead of launching each kernel: at batch 1 a 1.5B step on an H200 takes 4.0-4.3 ms
where its weights alone would allow 0.7 ms, the rest being launches (docs/gpu.md). A replay reads and
writes the addresses the capture saw, and the values a kernel got from the host at capture (a shape, a
CPU-side input such as GroupQueryAttention's `total_sequence_length`) stay baked in. So, as
onnxruntime-genai does:

- the KV buffers are allocated once, `length` positions long (no growth: growing moves them);
- the attention mask is one buffer of that length on the device, ones over the cached and new positions
  and zeros after, rewritten in place each step: attention reads the lengths from its sum (computed on
  the device), and `total_sequence_length` (its shape) never changes;
- each step width k (1..MAX_WIDTH) has its own input ids, `logits_to_keep` (0: every row) and output
  buffers (logits, and the graph's greedy ids and row sums: export/greedy_ids.py), bound once, and its
  own captured graph, selected with the run option `gpu_graph_id`. ORT keeps a captured graph under its
  id for the session's life, and replays it whatever is bound at the time, so each layout's buffers get
  ids of their own (`graph_base` + k, unique in the process): a layout made again (the load's probes
  make several) never replays a graph that writes into another's buffers.

Everything else runs uncaptured on the same buffers (`gpu_graph_id` -1): a prefill (a forward on an
empty cache, with a mask as long as its tokens, as onnxruntime-genai runs a prompt), a forward wider
than MAX_WIDTH or keeping fewer rows than it feeds, and every forward once a context outgrew `length`
(said in one line; the buffers grow as the shared layout's do and nothing captured is replayed after).
On the CPU EP (no capture) the same code runs with no run option: tests check there that it computes
the shared layout's bits. Whether a captured step gives the bits of the same step uncaptured is checked
at each width's first captured step (`run`).
"""
from __future__ import annotations

import itertools
import sys
from dataclasses import dataclass

import numpy as np

from edgespec.errors import first_line
from edgespec.runtime.engine.kv_graph import LOGITS_SUM, LOGITS_TO_KEEP, NEXT_IDS, GraphSignature, as_float32
from edgespec.runtime.engine.kv_shared import SharedLayout

MAX_WIDTH = 16              # widest captured step (a gamma-8 verify is 9; forced grammar tokens reach 17)
STATIC_LENGTH = 4096        # positions a static cache holds before it grows (a 1.5B Qwen's: 115 MB in fp16)
GRAPH_ID = "gpu_graph_id"   # ORT's run option selecting a captured graph (-1: run uncaptured)
_GRAPH_BASES = itertools.count(1)        # new_graph_base


@dataclass
class StepBuffers:
    """One step width's fixed inputs and outputs, bound once."""
    io: object
    input_ids: object               # OrtValue [1, k]
    logits: object                  # OrtValue [1, k, V]
    next_ids: object | None         # OrtValue [1, k] (the graph's greedy ids), None where it has none
    sums: object | None
    run_options: object | None      # gpu_graph_id = graph_base + k where the session captures


class StaticLayout(SharedLayout):
    """A shared KV cache whose steps run from fixed buffers (module docstring). `capture`: the session was
    made with CUDA graphs enabled, so every run names a graph (`graph_base` + k) or none (-1)."""

    def __init__(self, graph: GraphSignature, session, device: str = "cpu", max_position: int | None = None,
                 length: int = STATIC_LENGTH, capture: bool = False):
        super().__init__(graph, session, device, max_position)
        self.static_length = max(1, min(int(length), max_position or int(length)))
        self.capture = capture
        self.static = True              # False once a context outgrew static_length (nothing is replayed after)
        self.steps: dict[int, StepBuffers] = {}
        self.checked: set[int] = set()      # widths whose captured step was compared with the uncaptured one
        self.graph_base = new_graph_base()
        self.mask_host = np.zeros((1, 0), np.int64)
        self.mask_value = None
        if capture:
            self.plain_run = run_options(-1)

    def reserve(self, positions: int) -> None:
        """Size the static buffers at the first reservation (at least `length`); later ones do nothing:
        a generation's reservation counts max_new_tokens it may never reach, and only a forward that
        needs more positions than the buffers hold outgrows them (`run`)."""
        if not self.capacity:
            super().reserve(positions)

    def reset(self) -> None:
        """Empty the cache; a cache that had outgrown its static buffers gets new ones (and new graphs)."""
        super().reset()
        if not self.static and self.capacity:
            self.static, self.capacity, self.steps, self.checked = True, 0, {}, set()
            self.graph_base = new_graph_base()

    def grow(self, needed: int, exact: bool = False) -> None:
        first = not self.capacity
        if first:
            needed = max(needed, self.static_length)
        elif self.static:
            print(f"edgespec: {needed} positions outgrow the {self.capacity}-position static KV cache of the "
                  f"captured steps; this runner's steps run uncaptured from now on", file=sys.stderr)
            self.static = False
        super().grow(needed, exact=first or exact)
        if self.static:
            import onnxruntime as ort  # lazy: as in kv_shared.py

            self.mask_host = np.zeros((1, self.capacity), np.int64)
            self.mask_value = ort.OrtValue.ortvalue_from_numpy(self.mask_host.copy(), self.device, 0)
        self.steps = {}

    def step_buffers(self, k: int) -> StepBuffers:
        """Width k's buffers and binding, made at its first step."""
        import onnxruntime as ort  # lazy: as in kv_shared.py

        got = self.steps.get(k)
        if got is not None:
            return got
        g, session, dev = self.graph, self.session, self.device
        io = self.bind(session)
        ids = ort.OrtValue.ortvalue_from_shape_and_type([1, k], np.int64, dev, 0)
        io.bind_ortvalue_input("input_ids", ids)
        io.bind_ortvalue_input("attention_mask", self.mask_value)
        if g.keeps_last:
            # 0: every row; read by Slice's host-side `starts`, so bound in host memory
            io.bind_ortvalue_input(LOGITS_TO_KEEP, ort.OrtValue.ortvalue_from_numpy(np.zeros(1, np.int64)))
        logits = ort.OrtValue.ortvalue_from_shape_and_type([1, k, g.vocab], g.logits_dtype, dev, 0)
        io.bind_ortvalue_output("logits", logits)
        next_ids = sums = None
        if g.has_greedy_ids:
            next_ids = ort.OrtValue.ortvalue_from_shape_and_type([1, k], np.int64, dev, 0)
            sums = ort.OrtValue.ortvalue_from_shape_and_type([1, k], np.float32, dev, 0)
            io.bind_ortvalue_output(NEXT_IDS, next_ids)
            io.bind_ortvalue_output(LOGITS_SUM, sums)
        for o in session.get_outputs():      # the pruned drafter's constant outputs: fixed buffers too
            if o.name in g.extra_outputs and all(isinstance(d, int) for d in o.shape):
                io.bind_ortvalue_output(o.name, ort.OrtValue.ortvalue_from_shape_and_type(list(o.shape), np.int64,
                                                                                          dev, 0))
        got = self.steps[k] = StepBuffers(io, ids, logits, next_ids, sums,
                                          run_options(self.graph_base + k) if self.capture else None)
        return got

    def run(self, session, input_ids: np.ndarray, rows: int, pad_rows: int, ids: bool = False):
        """As SharedLayout.run; a step of 1..MAX_WIDTH tokens that keeps every row runs from its fixed
        buffers (replayed where the session captures), anything else uncaptured. A width's first captured
        step is run uncaptured too and compared bit for bit: the uncaptured result is the one returned,
        and where they differ nothing is replayed from then on (one line says so)."""
        s = input_ids.shape[1]
        end = self.length + s + pad_rows
        if end > self.capacity:
            self.grow(end)
        if not (self.static and session is self.session and rows == s and s <= MAX_WIDTH and self.length):
            return super().run(session, input_ids, rows, pad_rows, ids)
        step = self.step_buffers(s)
        step.input_ids.update_inplace(input_ids)
        self.mask_host[0, :end] = 1
        self.mask_host[0, end:] = 0
        self.mask_value.update_inplace(self.mask_host)
        if self.capture and s not in self.checked:
            self.checked.add(s)
            session.run_with_iobinding(step.io, self.plain_run)
            want = self.outputs(step, ids)
            try:
                session.run_with_iobinding(step.io, step.run_options)
                why = None if all(np.array_equal(a, b) for a, b in zip(self.outputs(step, ids), want)) else \
                    "gave other bits than the same step uncaptured"
            except Exception as exc:  # noqa: BLE001 - ORT's own types; the uncaptured result stands
                why = f"could not be captured ({first_line(exc)[:160]})"
            if why:
                print(f"edgespec: a captured {s}-token step (CUDA graph) {why}; this runner's steps run "
                      "uncaptured from now on", file=sys.stderr)
                self.capture = False
            got = want
        else:
            session.run_with_iobinding(step.io, step.run_options if self.capture else self.plain_run)
            got = self.outputs(step, ids)
        self.length += s
        return got if ids else got[0]

    @staticmethod
    def outputs(step: StepBuffers, ids: bool) -> tuple:
        """(the graph's greedy ids, row sums) or (logits,) of the step just run, copied to the host."""
        if ids:
            return step.next_ids.numpy()[0], step.sums.numpy()[0]
        return (as_float32(step.logits.numpy()[0]),)


def new_graph_base() -> int:
    """Graph ids no layout in this process has used: base + k for k = 1..MAX_WIDTH (module docstring)."""
    return next(_GRAPH_BASES) * (MAX_WIDTH + 1)


def run_options(graph_id: int):
    """RunOptions naming the captured graph `graph_id` (-1: none, an uncaptured run)."""
    import onnxruntime as ort  # lazy: as in kv_shared.py

    ro = ort.RunOptions()
    ro.add_run_config_entry(GRAPH_ID, str(int(graph_id)))
    return ro


def captures(session) -> bool:
    """Whether `session` was made with CUDA graphs enabled (its CUDA EP's `enable_cuda_graph`)."""
    try:
        options = session.get_provider_options() or {}
    except Exception:  # noqa: BLE001 - an ORT build without the call: no capture asked through us either
        return False
    return str((options.get("CUDAExecutionProvider") or {}).get("enable_cuda_graph", "0")) == "1"
