"""benchmarks/agent_loop.py's machinery on the real SmolLM2 (smollm-self, given Qwen2.5's chat template,
which takes tools): two `edgespec serve` subprocesses, the default and `--strategy ar`, one short task
on both with the openai client. The loop must finish, every step's answer must be identical on both
servers (greedy speculation is lossless), and from the second step on the server must keep the KV of the
conversation so far (the history re-rendered as it was generated: serve/tools.py)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from test_serve import bundle_path  # tests/ is on sys.path (conftest.py)
from test_serve_structured import QWEN_TEMPLATE, with_template

pytest.importorskip("llguidance")
pytestmark = pytest.mark.real

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import agent_loop  # noqa: E402
from agent_tasks import Task, call_tool  # noqa: E402

GREET = '''def greet(name):
    return "Hello, " + name
'''
TEST_GREET = '''from greet import greet


def test_greet():
    assert greet("Ada") == "Hello, Ada!", greet("Ada")
'''
TASK = Task("greet", "test", "Run the tests and tell me whether they pass.", {"greet.py": GREET,
                                                                             "test_greet.py": TEST_GREET})


def test_the_sandbox_tools():
    files = dict(TASK.files)
    report = call_tool(files, "run_tests", "{}")
    assert "test_greet.py::test_greet FAILED" in report and "1 failed" in report and "/tmp" not in report
    assert call_tool(files, "run_tests", "{}") == report                      # the same files, the same text
    assert call_tool(files, "replace_in_file", '{"path": "greet.py", "old": "name\\n", "new": "name + \\"!\\"\\n"}') \
        == "replaced 1 occurrence in greet.py"
    assert "1 passed" in call_tool(files, "run_tests", "{}")
    assert call_tool(files, "read_file", '{"path": "nope.py"}') == "error: no such file: nope.py"
    assert call_tool(files, "list_files", "{}") == "greet.py (2 lines)\ntest_greet.py (5 lines)"


def test_one_task_on_both_servers(request, tmp_path_factory):
    path = with_template(bundle_path(request), QWEN_TEMPLATE, tmp_path_factory.mktemp("agent") / "smollm-qwen")
    servers = {}
    try:
        args = ("--threads", "1", "--max-tokens-cap", "48", "--prefill-graph", "off")   # off: answers' KV kept too
        servers["default"] = agent_loop.Server(path, *args)
        servers["ar"] = agent_loop.Server(path, *args, "--strategy", "ar")
        [row] = agent_loop.compare(servers, [TASK], max_steps=4, max_tokens=48, first_tool_choice="required",
                                   log=lambda *a: None, tool_choice="auto")
    finally:
        for srv in servers.values():
            assert srv.stop() == 0, "".join(srv.lines)
    runs = row["runs"]
    assert row["finished"] and row["difference"] is None, row["difference"]
    assert agent_loop.answers(runs["default"]) == agent_loop.answers(runs["ar"])
    steps = runs["default"]["steps"]
    assert len(steps) >= 2 and steps[0]["calls"] and not steps[-1]["calls"], steps
    assert {s["strategy"] for s in runs["ar"]["steps"]} == {"ar"}
    for prev, step in zip(steps, steps[1:]):          # the conversation's KV kept from one step to the next,
        kept = prev["prompt_tokens"] + prev["completion_tokens"] - 1      # the answer's too (re-rendered as written)
        assert step["reused_tokens"] >= kept, [(s["prompt_tokens"], s["completion_tokens"], s["reused_tokens"]) for r in runs.values() for s in r["steps"]]
    assert "prefill" in agent_loop.phases([row], "default")
