"""The kept vocabulary written for server engines (export/server_vocab.py, `edgespec export --also-write`),
read back the way their loaders read it: SGLang's `load_token_map` (torch.load, weights_only) and
vLLM's EAGLE-3 `load_weights` (`d2t` -> draft_id_to_target_id, `t2d` skipped) + `compute_logits`."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from edgespec.cli import main
from edgespec.errors import ExportError
from edgespec.export.server_vocab import kept_target_ids, parse_kinds, write_server_vocab

torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")


def sglang_load_token_map(path: Path):
    """sglang/srt/speculative/eagle_worker.py load_token_map, for a local file."""
    hot_token_id = torch.load(str(path), weights_only=True)
    return torch.tensor(hot_token_id, dtype=torch.int64)


def vllm_draft_to_target(path: Path, draft_vocab_size: int, target_vocab: int):
    """vllm llama_eagle3: load_weights' renaming, then compute_logits' scatter of distinct draft logits."""
    params = {"draft_id_to_target_id": torch.zeros(draft_vocab_size, dtype=torch.long)}
    for name, loaded in safetensors_torch.load_file(str(path)).items():
        if "t2d" in name:
            continue
        if "d2t" in name:
            name = name.replace("d2t", "draft_id_to_target_id")
        assert params[name].shape == loaded.shape and params[name].dtype == loaded.dtype
        params[name] = loaded
    logits = torch.arange(draft_vocab_size, dtype=torch.float32)[None]      # draft logit i = i
    targets = torch.arange(draft_vocab_size) + params["draft_id_to_target_id"]
    new = logits.new_full((1, target_vocab), float("-inf"))
    new[:, targets] = logits
    return targets, new


def fake_bundle(tmp_path: Path, index_map: np.ndarray, target_vocab: int) -> Path:
    root = tmp_path / "b"
    (root / "vocab").mkdir(parents=True)
    np.save(root / "vocab" / "index_map.npy", index_map)
    (root / "manifest.json").write_text(json.dumps({"target": {"vocab_size": target_vocab},
                                                    "drafter": {"kept": len(index_map)}}))
    return root


@pytest.mark.parametrize("case", ["smollm-first-k", "calibrated-with-gaps"])
def test_written_files_read_back_as_the_loaders_do(tmp_path, case, request):
    if case == "smollm-first-k":          # the real smollm-self bundle's kept vocabulary
        env = os.environ.get("EDGESPEC_SMOLLM_BUNDLE")
        src = Path(env) if env else request.getfixturevalue("smollm_self_bundle")
        root = tmp_path / "b"
        (root / "vocab").mkdir(parents=True)
        shutil.copy(src / "manifest.json", root)
        shutil.copy(src / "vocab" / "index_map.npy", root / "vocab")
        target_vocab = json.loads((root / "manifest.json").read_text())["target"]["vocab_size"]
        index_map = np.load(root / "vocab" / "index_map.npy")
    else:     # a calibrated selection: scattered ids in frequency order, and a column with no target id
        target_vocab = 151936
        rng = np.random.default_rng(0)
        index_map = np.concatenate([rng.choice(target_vocab, 5000, replace=False), [-1]]).astype(np.int64)
        root = fake_bundle(tmp_path, index_map, target_vocab)
    sg, vl = write_server_vocab(root, ["sglang-token-map", "vllm-draft-vocab"])
    assert sg == root / "vocab" / "sglang_token_map.pt" and vl.name == "vllm_draft_vocab.safetensors"
    want = np.unique(index_map[index_map >= 0])

    hot = sglang_load_token_map(sg)
    assert hot.dtype == torch.int64 and hot.ndim == 1 and hot.tolist() == want.tolist()

    targets, logits = vllm_draft_to_target(vl, len(want), target_vocab)
    assert targets.tolist() == want.tolist()                      # draft id i -> i-th kept target id
    assert torch.isfinite(logits).sum() == len(want)              # no two draft ids on one target id
    assert logits[0, want[-1]].item() == len(want) - 1
    t2d = safetensors_torch.load_file(str(vl))["t2d"]
    assert t2d.dtype == torch.bool and t2d.shape == (target_vocab,) and t2d.nonzero().flatten().tolist() == want.tolist()


def test_bad_inputs(tmp_path):
    assert write_server_vocab(tmp_path / "target-only", []) == []     # no --also-write: reads nothing
    with pytest.raises(ExportError, match="cannot read its kept vocabulary"):
        write_server_vocab(tmp_path / "target-only", ["sglang-token-map"])
    with pytest.raises(ExportError, match="--also-write takes"):
        parse_kinds("sglang-token-map,nope")
    assert parse_kinds("sglang-token-map, vllm-draft-vocab") == ["sglang-token-map", "vllm-draft-vocab"]
    with pytest.raises(ExportError, match="no target token"):
        kept_target_ids(np.array([-1, -1]), 10)
    with pytest.raises(ExportError, match="out of the target vocabulary"):
        kept_target_ids(np.array([3, 12]), 10)


def test_export_refuses_a_bad_kind_before_exporting(tmp_path, capsys):
    out = tmp_path / "never"
    assert main(["export", "--pair", "smollm-self", "--keep", "64", "--out", str(out), "--also-write", "gguf"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--also-write takes" in err and not out.exists()
