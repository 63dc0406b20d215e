"""The target's padded-attention graph: exact 1-token steps at the speed of plain ones.

On the CPU EP an int4 builder graph's 1-token forward computes other logits than the same position in
a wider forward (0.13-0.2 on the Qwen2.5-Coder 1.5B), so until now the runtime padded every 1-token
step to 2 tokens (`edgespec.min_forward_tokens`), at about 1.13x the cost. Comparing the graph's
intermediate outputs row by row on the 1.5B (2-core Xeon, ORT 1.31) located the difference: every
MatMulNBits gives the same row whatever the number of rows, and it is GroupQueryAttention with a past
whose 1-query path (its probabilities x V product, M = 1) rounds differently from its path for 2+
queries. So only attention needs a second row.

This graph appends a copy of the last row of each GroupQueryAttention's packed QKV input (Slice +
Concat) and drops the extra output row after it (Slice). Where the builder feeds query, key and value
separately (Gemma-3: its q/k norms sit between the projection and attention), each of the three gets the
copy, so that the query and the new keys stay the same length, as GroupQueryAttention requires with a
past (padding the query alone failed the gemma3-270m export: "sequence_length=17, kv_sequence_length=16").
A sliding window (Gemma-3's local layers) is unaffected: the copy comes after every real row. Every
projection, MLP and the LM head run on the real rows only; attention always sees 2+ queries. The graph
takes an attention mask one position longer and writes one extra KV position, which the runtime never
counts (`edgespec.attention_pad_rows`, runtime/engine/kv.py) and the next forward overwrites. On the 1.5B
its 1-token step gave logits identical to the padded 2-token step of model.onnx (max |diff| 0.0) in
62.6 ms, against 64.0 ms for model.onnx's 1-token step and 72.9 ms for the padded one (/tmp script,
300-token past, median of 30).

Written beside model.onnx as `padded_attention.onnx` (a few hundred KB, the same `model.onnx.data`)
for every CPU graph (float32 logits) with GroupQueryAttention: whether its 1-token steps are exact is a property of the CPU
that runs it (on a 2-core AVX2 EPYC without VNNI the check below failed by 0.58 on 2026-11-27, where
the 2-core AVX-512 VNNI Xeon gives 0.0), so the export never decides it for other machines.
model.onnx stays the builder's graph: onnxruntime-genai runs it (bench `--peers`). The export checks
that the new graph's forwards of every width agree with model.onnx's padded ones on the exporting
machine and records the difference (manifest `checks.padded_attention_vs_padded_steps_max_abs_diff`):
information, and the runtime's choice where no device profile of its own machine exists yet
(runtime/planning/device_profile.py, runtime/planning/plan.py).
"""
from __future__ import annotations

import gc
from pathlib import Path

import numpy as np

PADDED_GRAPH = "padded_attention.onnx"
PAD_ROWS = 1


def pad_attention(model) -> int:
    """Edit an onnx.ModelProto in place: each GroupQueryAttention gets its last row of packed QKV (or of
    query, key and value, where they come apart) twice and returns its real rows only. Returns the
    number of attention nodes edited."""
    from onnx import TensorProto, helper

    g = model.graph
    consts = {"last": -1, "end": 2**62, "zero": 0, "axis": 1}
    g.initializer.extend(helper.make_tensor(f"edgespec/pad_attention/{k}", TensorProto.INT64, [1], [v])
                         for k, v in consts.items())
    c = {k: f"edgespec/pad_attention/{k}" for k in consts}
    nodes, edited = [], 0
    for node in g.node:
        if node.op_type != "GroupQueryAttention":
            nodes.append(node)
            continue
        out, name = node.output[0], node.name or f"gqa{edited}"
        for j, part in enumerate(("qkv", "key", "value")):    # packed QKV, or query, key and value apart
            if j >= len(node.input) or not node.input[j]:
                continue
            x = node.input[j]
            nodes.append(helper.make_node("Slice", [x, c["last"], c["end"], c["axis"]], [f"{name}/pad_row_{part}"],
                                          name=f"{name}/pad_slice_{part}"))
            nodes.append(helper.make_node("Concat", [x, f"{name}/pad_row_{part}"], [f"{name}/padded_{part}"],
                                          axis=1, name=f"{name}/pad_concat_{part}"))
            node.input[j] = f"{name}/padded_{part}"
        node.output[0] = f"{name}/padded_out"
        nodes.append(node)
        nodes.append(helper.make_node("Slice", [f"{name}/padded_out", c["zero"], c["last"], c["axis"]], [out],
                                      name=f"{name}/unpad"))
        edited += 1
    del g.node[:]
    g.node.extend(nodes)
    return edited


def write_padded_graph(target_dir: Path) -> Path | None:
    """Write target_dir/padded_attention.onnx from model.onnx; None (nothing written) where the graph
    has no GroupQueryAttention nodes or is not a CPU graph (its logits not float32: an fp16 graph for a
    GPU EP, which the export cannot run here to check it)."""
    import onnx  # lazy: the [export] extra

    from edgespec.runtime.engine.kv import MIN_TOKENS_KEY, PAD_ROWS_KEY

    model = onnx.load(str(Path(target_dir) / "model.onnx"), load_external_data=False)
    logits = next((o for o in model.graph.output if o.name == "logits"), None)
    if logits is None or logits.type.tensor_type.elem_type != onnx.TensorProto.FLOAT or not pad_attention(model):
        return None
    for p in [p for p in model.metadata_props if p.key in (MIN_TOKENS_KEY, PAD_ROWS_KEY)]:
        model.metadata_props.remove(p)
    model.metadata_props.add(key=PAD_ROWS_KEY, value=str(PAD_ROWS))
    out = Path(target_dir) / PADDED_GRAPH
    onnx.save_model(model, str(out))     # the initializers keep their external locations: the same data file
    return out


def _logits_by_width(runner, ids: np.ndarray, prefix: int, width: int) -> np.ndarray:
    """Logits of ids[prefix:] after a prefix-token prefill, fed `width` tokens a forward, through the
    runtime's own runner (which pads model.onnx's 1-token forwards and feeds the padded graph's mask)."""
    runner.reset()
    runner.forward(ids[:prefix])
    return np.concatenate([runner.forward(ids[i:i + width]).copy() for i in range(prefix, ids.size, width)])


def check_padded_graph(target_dir: Path, ids: np.ndarray, prefix: int = 16) -> float:
    """Max |diff| between model.onnx's padded 1-token forwards and the padded-attention graph's forwards
    of 1, 2 and 3 tokens and of all of them at once, on the same text (prepacked, one graph at a time)."""
    from edgespec.export.onnx_export import ort_session
    from edgespec.runtime.engine.kv import ModelRunner

    target_dir = Path(target_dir)
    runner = ModelRunner(ort_session(target_dir / "model.onnx", prepack=True), "check")
    ref = _logits_by_width(runner, ids, prefix, 1)
    del runner
    gc.collect()
    runner = ModelRunner(ort_session(target_dir / PADDED_GRAPH, prepack=True), "check")
    diff = max(float(np.abs(_logits_by_width(runner, ids, prefix, w) - ref).max()) for w in (1, 2, 3, ids.size - prefix))
    del runner
    gc.collect()
    return diff


CHECK_TOKENS = 28           # 16 prefilled + 12 compared at each width


def write_and_check(target_dir: Path, progress: bool = True) -> float | None:
    """write_padded_graph, then check_padded_graph on held-out text in the target's tokens. The graph
    stays whatever the check says: the difference is this machine's, recorded in the manifest (runtime
    machines measure their own: runtime/planning/device_profile.py). Returns the max |diff|, None where no graph
    was written. A graph the export cannot build, run or compare (an attention layout the rewrite gets
    wrong, say) is removed and skipped with one progress line naming why, never a traceback: the bundle
    is then one without the variant, and the runtime steps model.onnx (padded where the export asked).
    OSError (a full disk) is not skipped: bundle_writer says what to do about it."""
    from edgespec.export.progress import log
    from edgespec.export.quality import held_out_ids

    try:
        path = write_padded_graph(target_dir)
        if path is None:
            return None
        ids = np.concatenate(held_out_ids(Path(target_dir) / "tokenizer.json", n_tokens=64, segment=64))[:CHECK_TOKENS]
        diff = check_padded_graph(target_dir, ids)
        if not np.isfinite(diff):
            raise ValueError(f"its logits differ by {diff} from padded model.onnx steps")
        return diff
    except OSError:
        raise
    except Exception as exc:  # ORT raises its own types for a graph it cannot load or run
        gc.collect()          # the failed sessions, before their graph is removed
        (Path(target_dir) / PADDED_GRAPH).unlink(missing_ok=True)
        log(progress, skip_message(exc))
        return None


def skip_message(exc: BaseException) -> str:
    """The one line an export prints where it leaves the padded-attention graph out."""
    why = " ".join(f"{type(exc).__name__}: {exc}".split())[:240]
    return (f"no {PADDED_GRAPH} in this bundle (the runtime steps model.onnx): the export could not build "
            f"or check it ({why})")
