"""A tool-using coding agent through `edgespec serve`, end to end: the default server against `--strategy ar`
(issue 48's agent-loop target: wall time <= 0.6x, every answer identical).

The agent is written with the `openai` client and its defaults (no parallel_tool_calls, temperature 0,
non-streamed), over benchmarks/agent_tasks.py's in-memory projects (list_files, read_file, write_file,
replace_in_file, run_tests, which really runs the project's tests). Each task is a loop: ask, run every
tool call, feed the results back, until the agent calls `finish` or --max-steps model steps. Every request
says tool_choice "required" (as smolagents' tool-calling agent does, with its final_answer tool): under
"auto" (`--tool-choice auto`, the loop then ends at a text answer) Qwen2.5-Coder-1.5B answered in text
after one or two steps, with the edited code in its answer instead of a write_file call (2026-11-27).

Two servers on the same bundle, each `edgespec serve --bundle B --port 0 --threads N` in a subprocess: one
at the default `--strategy auto`, one at `--strategy ar`. After one short untimed request to each, every
task runs on both, one server at a time (never both busy), the order alternating from task to task. The
default server keeps its answer store across tasks, as a server does.

Reported per task: model steps, the loop's wall time on each server (requests and tool runs), the ratio
default / ar, tokens generated, and whether every step's answer (content, tool calls' names and arguments,
finish_reason) is identical; then the pooled ratio (sum of wall times) and the worst task. With --json,
every step's `edgespec` stats (prefill, prefix reuse, drafts kept) of both servers go to a file. Exit
status 1 if any answer differs (greedy speculation is lossless) or a loop hits --max-steps.

    python benchmarks/agent_loop.py --bundle B [--split calib|test|all] [--threads 2] [--max-steps 12]
        [--max-tokens 1024] [--tasks ID,...] [--tool-choice required|auto] [--json OUT]
        [--default-arg=--no-cross-request ...]

Tune on `--split calib` only; report `--split test` (docs/results.md). Timings are comparable only within
one run (the two servers interleaved on one machine).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import openai

from edgespec.serve.process import ServeProcess

sys.path.insert(0, str(Path(__file__).resolve().parent))
from agent_tasks import FINISH, FINISH_SYSTEM, SYSTEM, TOOLS, Task, call_tool, tasks  # noqa: E402

MODEL = "agent"
STEP_STATS = ("prefill_ms", "reused_tokens", "verify_forwards", "drafted", "accepted", "store_drafted",
              "store_accepted", "guesses", "guesses_accepted", "forced", "forced_accepted")


class Server(ServeProcess):
    """The agent's server: `edgespec serve` in a child process, served as MODEL; a long start allowed (the
    1.5B pair's first load checks its files)."""

    def __init__(self, bundle, *args: str, startup_s: float = 900):
        super().__init__(bundle, "--model-name", MODEL, *args, startup_s=startup_s)

    def client(self, **kw):
        return super().client(timeout=3600, **kw)

    def stop(self, wait_s: float = 60) -> int:
        return super().stop(wait_s)


def run_loop(client: openai.OpenAI, task: Task, max_steps: int = 12, max_tokens: int = 1024,
             first_tool_choice: str | None = None, tool_choice: str = "required") -> dict:
    """One task's agent loop on one server: {"steps": [...], "wall_s", "finished", "files"}. Each step
    records what must be identical across servers (content, calls, finish) and the server's stats.
    tool_choice "required": every request must call a tool, and the loop ends at `finish`; "auto": none
    is sent (the model decides) but on the first request `first_tool_choice`, and the loop ends at a
    text answer."""
    files = dict(task.files)
    required = tool_choice == "required"
    messages = [{"role": "system", "content": FINISH_SYSTEM if required else SYSTEM},
                {"role": "user", "content": task.prompt}]
    steps, finished = [], False
    t0 = time.perf_counter()
    for i in range(max_steps):
        kw = dict(model=MODEL, messages=messages, tools=TOOLS + [FINISH] if required else TOOLS, temperature=0,
                  max_tokens=max_tokens)
        if required or (i == 0 and first_tool_choice is not None):
            kw["tool_choice"] = "required" if required else first_tool_choice
        t = time.perf_counter()
        resp = client.chat.completions.create(**kw)
        choice = resp.choices[0]
        msg = choice.message
        calls = [(c.function.name, c.function.arguments) for c in msg.tool_calls or []]
        ext = resp.model_extra.get("edgespec") or {}
        steps.append({"content": msg.content, "calls": calls, "finish": choice.finish_reason,
                      "request_s": time.perf_counter() - t, "prompt_tokens": resp.usage.prompt_tokens,
                      "completion_tokens": resp.usage.completion_tokens,
                      **{k: ext.get(k) for k in ("strategy", "ttft_ms", "total_ms", *STEP_STATS)}})
        messages.append(msg.model_dump(exclude_none=True, exclude={"refusal", "annotations", "audio"}))
        if not msg.tool_calls or any(c.function.name == "finish" for c in msg.tool_calls):
            finished = not required or bool(msg.tool_calls)
            break
        for c in msg.tool_calls:
            messages.append({"role": "tool", "tool_call_id": c.id,
                             "content": call_tool(files, c.function.name, c.function.arguments)})
    return {"steps": steps, "wall_s": time.perf_counter() - t0, "finished": finished, "files": files}


def answers(run: dict) -> list[tuple]:
    """What must be identical between the two servers, step by step (call ids are random)."""
    return [(s["content"], s["calls"], s["finish"]) for s in run["steps"]]


def first_difference(a: dict, b: dict) -> str | None:
    for i, (x, y) in enumerate(zip(answers(a), answers(b))):
        if x != y:
            return f"step {i + 1}: {str(x)[:160]!r} vs {str(y)[:160]!r}"
    if len(a["steps"]) != len(b["steps"]):
        return f"{len(a['steps'])} steps vs {len(b['steps'])}"
    return None


def compare(servers: dict[str, Server], todo: list[Task], max_steps: int, max_tokens: int,
            first_tool_choice: str | None = None, log=print, on_row=None, tool_choice: str = "required") -> list[dict]:
    """Every task on both servers (named "default" and "ar"), one at a time, the order alternating."""
    clients = {name: srv.client() for name, srv in servers.items()}
    for client in clients.values():            # warm-up, untimed
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Say hi."}],
                                       max_tokens=4, temperature=0)
    rows = []
    for n, task in enumerate(todo):
        order = ("default", "ar") if n % 2 == 0 else ("ar", "default")
        runs = {name: run_loop(clients[name], task, max_steps, max_tokens, first_tool_choice, tool_choice)
                for name in order}
        d, a = runs["default"], runs["ar"]
        row = {"task": task.id, "first": order[0], "steps": len(d["steps"]), "default_s": d["wall_s"],
               "ar_s": a["wall_s"], "ratio": d["wall_s"] / a["wall_s"],
               "tokens": sum(s["completion_tokens"] for s in d["steps"]),
               "finished": d["finished"] and a["finished"], "difference": first_difference(d, a), "runs": runs}
        rows.append(row)
        log(f"{task.id:<22} {row['steps']:>5} {row['default_s']:>9.1f} {row['ar_s']:>9.1f} {row['ratio']:>6.3f} "
            f"{row['tokens']:>7} {'yes' if row['difference'] is None else 'NO':>9} "
            f"{'' if row['finished'] else '(hit --max-steps)'}")
        log("  steps: " + " | ".join(",".join(n for n, _ in st["calls"]) or f"text({st['finish']})"
                                     for st in d["steps"]))
        if row["difference"]:
            log(f"  first difference: {row['difference']}")
        if on_row is not None:
            on_row(rows)
    return rows


def phases(rows: list[dict], name: str) -> str:
    """Where the time went on one server: prefill against the rest, prefix reuse, drafts kept."""
    steps = [s for r in rows for s in r["runs"][name]["steps"]]
    tot = lambda k: sum(s.get(k) or 0 for s in steps)           # noqa: E731
    wall = sum(r["runs"][name]["wall_s"] for r in rows)
    req = sum(s["request_s"] for s in steps)
    return (f"{name}: {len(steps)} requests, wall {wall:.1f} s (requests {req:.1f} s), prefill "
            f"{tot('prefill_ms') / 1e3:.1f} s of {tot('total_ms') / 1e3:.1f} s generating; prompt tokens "
            f"{tot('prompt_tokens')}, KV reused {tot('reused_tokens')}; generated {tot('completion_tokens')} in "
            f"{tot('verify_forwards')} verify forwards; drafts kept {tot('accepted')}/{tot('drafted')} "
            f"(store {tot('store_accepted')}/{tot('store_drafted')}), guesses kept "
            f"{tot('guesses_accepted')}/{tot('guesses')}, forced kept {tot('forced_accepted')}/{tot('forced')}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bundle", required=True, type=Path)
    ap.add_argument("--split", choices=("calib", "test", "all"), default="test")
    ap.add_argument("--threads", type=int, default=2, help="each server's --threads (default 2)")
    ap.add_argument("--max-steps", type=int, default=12, help="model steps per loop before it is stopped (default 12)")
    ap.add_argument("--max-tokens", type=int, default=1024, help="max_tokens of each request (default 1024)")
    ap.add_argument("--tasks", default=None, help="comma-separated task ids (default: the split's)")
    ap.add_argument("--default-arg", action="append", default=[], metavar="ARG",
                    help="an extra flag for the default server, repeatable (e.g. --default-arg=--no-cross-request)")
    ap.add_argument("--json", type=Path, default=None, help="write every step of both servers here (after each task)")
    ap.add_argument("--tool-choice", default="required", choices=("required", "auto"),
                    help="required (default): every request must call a tool, a `finish` tool ends the loop; auto: "
                         "no tool_choice sent, a text answer ends the loop")
    ap.add_argument("--first-tool-choice", default=None, choices=("required",),
                    help="with --tool-choice auto: tool_choice of each loop's first request (default: none sent)")
    args = ap.parse_args(argv)
    if not (args.bundle / "manifest.json").is_file():
        ap.error(f"--bundle {args.bundle}: not a bundle directory (no manifest.json)")
    todo = tasks(args.split)
    if args.tasks:
        ids = args.tasks.split(",")
        unknown = sorted(set(ids) - {t.id for t in tasks("all")})
        if unknown:
            ap.error(f"--tasks: unknown task(s) {', '.join(unknown)}; known: {', '.join(t.id for t in tasks('all'))}")
        todo = [t for t in tasks("all") if t.id in ids]
    def save(rows):
        if args.json:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "rows": rows},
                                            indent=1, default=str))

    common = ("--threads", str(args.threads), "--timeout", "3600", "--max-tokens-cap", str(args.max_tokens))
    servers = {}
    try:
        servers["default"] = Server(args.bundle, *common, *args.default_arg)
        servers["ar"] = Server(args.bundle, *common, "--strategy", "ar")
        print(f"# {len(todo)} task(s), split {args.split}, threads {args.threads}, bundle {args.bundle}")
        print(f"{'task':<22} {'steps':>5} {'default_s':>9} {'ar_s':>9} {'ratio':>6} {'tokens':>7} {'identical':>9}")
        rows = compare(servers, todo, args.max_steps, args.max_tokens, args.first_tool_choice, on_row=save,
                       tool_choice=args.tool_choice)
    finally:
        for srv in servers.values():
            srv.stop()
    pooled = sum(r["default_s"] for r in rows) / sum(r["ar_s"] for r in rows)
    worst = max(rows, key=lambda r: r["ratio"])
    same = all(r["difference"] is None for r in rows)
    print(f"pooled default/ar wall time {pooled:.3f} (target <= 0.6); worst task {worst['task']} {worst['ratio']:.3f}; "
          f"answers identical: {'yes' if same else 'NO'}")
    for name in ("default", "ar"):
        print(phases(rows, name))
    return 0 if same and all(r["finished"] for r in rows) else 1


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
