"""The bench journal: REPORT/records.jsonl, one line per measured generation, flushed as it is measured.

Long on-device runs get cut off (a killed app, a dead battery, a session limit). With the journal nothing
measured is lost, and `edgespec bench --resume` continues the same run: it skips every (repeat, prompt,
strategy, γ) already in the journal and measures the rest in the usual interleaved order, with the same
per-prompt seeds. The first line is a header whose fingerprint holds every setting that changes what a
generation measures; resuming with different ones is refused. --limit and --repeats are not in it, so a
resumed run may also grow (more prompts or repeats of the same configurations).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from edgespec.profiler.errors import BenchError
from edgespec.profiler.settings import settings_dict

NAME = "records.jsonl"
FORMAT = "edgespec-bench-records"
FINGERPRINT_KEYS = ("prompts", "split", "categories", "strategies", "draft_lengths", "max_new_tokens", "temperature",
                    "top_k", "top_p", "seed", "ep", "draft_ep", "threads", "draft_threads", "chat", "options")


def fingerprint(settings, manifest_sha256: str) -> dict:
    d = settings_dict(settings)
    return {"bundle_manifest_sha256": manifest_sha256, **{k: d[k] for k in FINGERPRINT_KEYS}}


def record_key(rec: dict) -> tuple:
    return rec["repeat"], rec["prompt_id"], rec["strategy"], rec["draft_length"]


def read(out: Path, expected: dict) -> list[dict]:
    """The records of an earlier run in `out`, after checking its fingerprint against `expected`.
    A last line cut off mid-write (the process was killed) is dropped with a warning."""
    path = Path(out) / NAME
    if not path.exists():
        raise BenchError(f"--resume: {path} does not exist: there is no earlier run to continue in {out}")
    lines = path.read_text(encoding="utf-8").splitlines()
    try:
        header = json.loads(lines[0]) if lines else {}
    except json.JSONDecodeError:
        header = {}
    if header.get("format") != FORMAT:
        raise BenchError(f"--resume: {path} is not an edgespec bench journal (bad or missing header line)")
    have = header.get("fingerprint", {})
    differ = [k for k in expected if json.dumps(have.get(k), sort_keys=True) != json.dumps(expected[k], sort_keys=True)]
    if differ:
        detail = "; ".join(f"{k}: journal {have.get(k)!r}, now {expected[k]!r}" for k in differ)
        raise BenchError(f"--resume: the settings differ from the run in {out} ({detail}); resume with the same "
                         "settings, or start a new run in another --report directory")
    records = []
    for n, line in enumerate(lines[1:], start=2):
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            if n != len(lines):
                raise BenchError(f"--resume: {path} line {n} is corrupt (not JSON); it is not the last line, so "
                                 "this is not a cut-off write: refusing to guess") from None
            print(f"edgespec: warning: dropping the cut-off last line of {path}", file=sys.stderr)
    return records


class Journal:
    """Appends records to REPORT/records.jsonl, one flushed line each."""

    def __init__(self, out: Path, fp: dict, records: list[dict] | None):
        """records None: a new run (refused if the directory already holds a journal with generations);
        otherwise the records read back by `read`, rewritten so a cut-off last line is gone."""
        self.path = Path(out) / NAME
        if records is None and self.path.exists():
            n = max(len(self.path.read_text(encoding="utf-8").splitlines()) - 1, 0)
            if n:
                raise BenchError(f"{out} already holds a bench journal with {n} measured generation(s): pass "
                                 "--resume to continue that run, or choose another --report directory")
        tmp = self.path.with_name(NAME + ".tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(json.dumps({"format": FORMAT, "version": 1, "fingerprint": fp}) + "\n")
            for rec in records or []:
                f.write(json.dumps(rec) + "\n")
        tmp.replace(self.path)
        self._file = open(self.path, "a", encoding="utf-8")

    def append(self, rec: dict) -> None:
        self._file.write(json.dumps(rec) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()
