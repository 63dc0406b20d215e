"""A bundle's kept (pruned) drafter vocabulary, written for server engines that take one.

When one device is not enough, the same calibrated kept vocabulary can prune the drafter head of a
server engine:

- SGLang `--speculative-token-map FILE` (FR-Spec for EAGLE drafters): `load_token_map` in
  sglang/srt/speculative/eagle_worker.py does `torch.load(FILE, weights_only=True)` and
  `torch.tensor(..., dtype=torch.int64)`: a 1-D list of *target* token ids ("hot" tokens). We save an
  int64 tensor of the kept target ids (`sglang_token_map.pt`).
- vLLM EAGLE-3 draft vocabularies: the drafter checkpoint carries `d2t` (int64 [draft_vocab_size],
  target id = draft id + d2t[draft id]) and `t2d` (bool [target vocab], True where kept);
  `load_weights` in vllm/model_executor/models/llama_eagle3.py renames `d2t` to
  `draft_id_to_target_id` and skips `t2d`, and `compute_logits` scatters the draft logits to
  `arange(draft_vocab_size) + d2t`. Draft ids are the kept target ids in ascending order (the head rows
  must follow that order). We write both tensors to `vllm_draft_vocab.safetensors`, to be merged
  into the drafter checkpoint.

Both files go to the bundle's `vocab/` folder (not listed in the manifest: they are outputs for other
engines, never read by edgespec). torch and safetensors are imported lazily (the export extra).
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from edgespec.errors import ExportError

KINDS = {"sglang-token-map": "sglang_token_map.pt", "vllm-draft-vocab": "vllm_draft_vocab.safetensors"}


def parse_kinds(value: str | None) -> list[str]:
    """`--also-write A,B` -> [A, B]; unknown names are an error."""
    if not value:
        return []
    kinds = [v.strip() for v in value.split(",") if v.strip()]
    bad = [k for k in kinds if k not in KINDS]
    if bad or not kinds:
        raise ExportError(f"--also-write takes {', '.join(KINDS)} (comma-separated), got {value!r}")
    return kinds


def kept_target_ids(index_map: np.ndarray, target_vocab: int) -> np.ndarray:
    """The kept columns' target ids, ascending and unique (columns without a target id dropped)."""
    ids = np.unique(np.asarray(index_map, dtype=np.int64))
    ids = ids[ids >= 0]
    if not len(ids):
        raise ExportError("the bundle's kept vocabulary maps to no target token")
    if ids[-1] >= target_vocab:
        raise ExportError(f"kept target id {int(ids[-1])} is out of the target vocabulary ({target_vocab})")
    return ids


def write_sglang_token_map(path: Path, ids: np.ndarray) -> Path:
    import torch  # lazy: export extra
    torch.save(torch.from_numpy(np.ascontiguousarray(ids, dtype=np.int64)), str(path))
    return path


def write_vllm_draft_vocab(path: Path, ids: np.ndarray, target_vocab: int) -> Path:
    from safetensors.numpy import save_file  # lazy: comes with the export extra (transformers)
    d2t = ids - np.arange(len(ids), dtype=np.int64)
    t2d = np.zeros(target_vocab, dtype=bool)
    t2d[ids] = True
    save_file({"d2t": d2t, "t2d": t2d}, str(path), metadata={"format": "pt", "source": "edgespec"})
    return path


def write_server_vocab(bundle_root: str | Path, kinds: list[str]) -> list[Path]:
    """Write each requested file into BUNDLE/vocab/ from its index_map.npy and manifest."""
    root = Path(bundle_root)
    if not kinds:                        # nothing asked (every target-only export): read nothing
        return []
    try:
        manifest = json.loads((root / "manifest.json").read_text(encoding="utf-8"))
        index_map = np.load(root / "vocab" / "index_map.npy")
    except (OSError, ValueError) as exc:
        raise ExportError(f"bundle {root}: cannot read its kept vocabulary ({exc})") from exc
    if not manifest.get("drafter"):
        raise ExportError(f"bundle {root} has no drafter, hence no kept vocabulary to write")
    target_vocab = int(manifest["target"]["vocab_size"])
    ids = kept_target_ids(index_map, target_vocab)
    out = []
    for kind in kinds:
        path = root / "vocab" / KINDS[kind]
        if kind == "sglang-token-map":
            out.append(write_sglang_token_map(path, ids))
        else:
            out.append(write_vllm_draft_vocab(path, ids, target_vocab))
    return out
