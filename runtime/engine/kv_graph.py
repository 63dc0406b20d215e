"""What a runner's graph says about itself, read once from its ORT session: `GraphSignature` (input and
output names, the KV shape and dtype, the logits width, optional inputs, edgespec's metadata), and the
feeds every KV layout builds from it. `ForwardCounts`: a runner's totals over its life.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from edgespec.errors import BundleError

PAST_PREFIX = "past_key_values."
PRESENT_PREFIX = "present."
LOGITS_TO_KEEP = "logits_to_keep"        # the graph input export/last_logits.py adds
KV_KEY = "edgespec.kv_cache"             # "shared": builder graphs, whose attention writes the past in place
MIN_TOKENS_KEY = "edgespec.min_forward_tokens"
# export/greedy_ids.py: the graph's own argmax of each logits row, and the row's sum (NaN and inf show in it)
NEXT_IDS, LOGITS_SUM = "next_ids", "logits_sum"
# export/padded_attention.py: the graph appends this many copies of the last row to attention's queries
# (and drops them after), so it takes a mask that many positions longer and writes that many extra KV
# positions, which the runner never counts (the next forward overwrites them).
PAD_ROWS_KEY = "edgespec.attention_pad_rows"
_ORT_TO_NUMPY = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(double)": np.float64,
                 "tensor(bfloat16)": np.float32}


def graph_meta(session) -> dict:
    """The graph's custom metadata (edgespec's keys)."""
    return getattr(session.get_modelmeta(), "custom_metadata_map", None) or {}


def graph_io(session) -> tuple:
    """The graph's inputs and outputs, by name and element type."""
    return ([(i.name, i.type) for i in session.get_inputs()], [(o.name, o.type) for o in session.get_outputs()])


def keep_feed(rows: int, s: int) -> np.ndarray:
    """The `logits_to_keep` input for `rows` of an `s`-token forward."""
    return np.array([0 if rows == s else rows], dtype=np.int64)      # 0: every position


def as_float32(logits: np.ndarray) -> np.ndarray:
    """Logits as float32 (an fp16 graph's, on a GPU EP, are converted on the host)."""
    return logits if logits.dtype == np.float32 else logits.astype(np.float32)


class GraphSignature:
    """A causal LM graph with past inputs, as its session declares it (docs/architecture.md, "The target
    graph"); a graph that lacks what the runner feeds or reads is a one-line BundleError naming `role`.
    `head_dim`: the KV head dimension where the graph leaves it symbolic."""

    def __init__(self, session, role: str, head_dim: int | None = None):
        inputs = {i.name: i for i in session.get_inputs()}
        outputs = {o.name: o for o in session.get_outputs()}
        for need in ("input_ids", "attention_mask"):
            if need not in inputs:
                raise BundleError(f"{role} graph has no input {need!r} (inputs: {', '.join(inputs)})")
        if "logits" not in outputs:
            raise BundleError(f"{role} graph has no output 'logits'")
        self.past_names = [n for n in inputs if n.startswith(PAST_PREFIX)]
        self.present_names = [PRESENT_PREFIX + n[len(PAST_PREFIX):] for n in self.past_names]
        missing = [n for n in self.present_names if n not in outputs]
        if missing:
            raise BundleError(f"{role} graph lacks outputs {missing[:2]} for its past inputs")
        if not self.past_names:
            raise BundleError(f"{role} graph has no past_key_values inputs (export with past)")
        self.has_position_ids = "position_ids" in inputs
        # export/last_logits.py: graphs that can emit the last k positions' logits only (prefill).
        self.keeps_last = LOGITS_TO_KEEP in inputs
        past = inputs[self.past_names[0]]          # [batch, kv_heads, past, head_dim]
        self.kv_heads = int(past.shape[1])
        self.head_dim = int(past.shape[3]) if isinstance(past.shape[3], int) else int(head_dim or 0)
        if not self.head_dim:
            raise BundleError(f"{role} graph has a symbolic KV head dimension and none was given")
        self.kv_dtype = _ORT_TO_NUMPY.get(past.type, np.float32)
        self.vocab = outputs["logits"].shape[-1]
        self.logits_dtype = _ORT_TO_NUMPY.get(outputs["logits"].type, np.float32)
        self.has_greedy_ids = NEXT_IDS in outputs and LOGITS_SUM in outputs
        self.extra_outputs = [n for n in outputs if n not in ("logits", NEXT_IDS, LOGITS_SUM, *self.present_names)]
        meta = graph_meta(session)
        # A quantized graph may declare that its 1-token forwards compute other logits (attention's 1-query
        # path, amplified by int8 activations: docs/quantization.md); a runner then pads them so every
        # forward computes the same function. A padded-attention graph (PAD_ROWS_KEY) needs no padding.
        self.declared_min_tokens = max(1, int(meta.get(MIN_TOKENS_KEY, 1)))
        self.pad_rows = max(0, int(meta.get(PAD_ROWS_KEY, 0)))
        self.declares_shared = meta.get(KV_KEY) == "shared"

    @property
    def output_names(self) -> list[str]:
        return ["logits", *self.present_names]

    def empty_past(self) -> np.ndarray:
        """One past input of an empty cache, [1, kv_heads, 0, head_dim]."""
        return np.zeros((1, self.kv_heads, 0, self.head_dim), dtype=self.kv_dtype)

    def step_feeds(self, input_ids: np.ndarray, past: int, rows: int, pad_rows: int) -> dict:
        """The feeds of a forward of `input_ids` [1, s] after `past` cached positions, less the past
        inputs: the attention mask covers the pad rows a padded-attention graph writes; `logits_to_keep`
        asks for `rows` rows where the graph takes it."""
        s = input_ids.shape[1]
        feeds = {"input_ids": input_ids, "attention_mask": np.ones((1, past + s + pad_rows), dtype=np.int64)}
        if self.keeps_last:
            feeds[LOGITS_TO_KEEP] = keep_feed(rows, s)
        if self.has_position_ids:
            feeds["position_ids"] = np.arange(past, past + s, dtype=np.int64).reshape(1, s)
        return feeds


@dataclass
class ForwardCounts:
    """A runner's forwards over its life (callers book per-generation time from differences)."""

    time_ms: float = 0.0          # wall time of every forward
    last_ms: float = 0.0          # of the latest
    forwards: int = 0
    tokens_fed: int = 0

    def add(self, ms: float, tokens: int) -> None:
        self.last_ms = ms
        self.time_ms += ms
        self.forwards += 1
        self.tokens_fed += tokens
