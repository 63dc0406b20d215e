"""The bench journal: REPORT/records.jsonl, one line per measured generation, flushed as it is measured.

Long on-device runs get cut off (a killed app, a dead battery, a session limit). With the journal nothing
measured is lost, and `edgespec bench --resume` continues the same run: it skips every (repeat, prompt,
strategy, γ) already in the journal and measures the rest in the usual interleaved order, with the same
per-prompt seeds. The first line is a header whose fingerprint holds every setting that changes what a
generation measures; resuming with different ones is refused. The prompts are fingerprinted by content
(`prompts_sha256`), not by path: an edited prompt file would put two texts under one prompt id. --limit
and --repeats are not in it, so a resumed run may also grow (more prompts or repeats of the same
configurations). A record's configuration is (strategy, draft_length_setting): an int gamma or "auto".
"""
from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

from edgespec import jsonio
from edgespec.calibrate.prompts import prompts_digest
from edgespec.profiler.errors import BenchError
from edgespec.profiler.settings import settings_dict

NAME = "records.jsonl"
FORMAT = "edgespec-bench-records"
VERSION = 2                 # 2: records carry draft_length_setting and the per-round lists
FINGERPRINT_KEYS = ("split", "categories", "strategies", "draft_lengths", "max_draft_length", "max_new_tokens",
                    "temperature", "top_k", "top_p", "seed", "ep", "draft_ep", "threads", "draft_threads", "chat",
                    "options", "prefill_graph")
FINGERPRINT_DEFAULTS = {"prefill_graph": False}    # keys added later: what journals written before meant


def prompts_sha256(spec: str, path: Path | None, prompts: list) -> str:
    """The prompts' content hash: sha256 of the file's bytes, or for the built-in set (path None) of the
    loaded prompts (ids, categories and texts)."""
    if path is None:
        return prompts_digest(prompts)
    try:
        return hashlib.sha256(Path(path).expanduser().read_bytes()).hexdigest()
    except OSError as exc:
        raise BenchError(f"cannot read prompt file {spec} ({exc.strerror or exc})") from None


def fingerprint(settings, manifest_sha256: str, prompts_digest: str, has_prefill_graph: bool = True) -> dict:
    """What a resumed run must share with the journaled one. `prefill_graph` as it acts: a bundle without a
    prefill graph (or a non-CPU EP) runs "auto" as False, which is what journals from before the key meant."""
    d = settings_dict(settings)
    if not has_prefill_graph and d["prefill_graph"] == "auto":
        d["prefill_graph"] = False
    return {"bundle_manifest_sha256": manifest_sha256, "prompts_sha256": prompts_digest,
            **{k: d[k] for k in FINGERPRINT_KEYS}}


def config_of(rec: dict) -> tuple:
    """(strategy, draft-length setting) of a record."""
    return rec["strategy"], rec.get("draft_length_setting", rec["draft_length"])


def record_key(rec: dict) -> tuple:
    return rec["repeat"], rec["prompt_id"], *config_of(rec)


def read(out: Path, expected: dict) -> list[dict]:
    """The records of an earlier run in `out`, after checking its fingerprint against `expected`.
    A last line cut off mid-write (the process was killed) is dropped with a warning."""
    path = Path(out) / NAME
    if not path.exists():
        raise BenchError(f"--resume: {path} does not exist: there is no earlier run to continue in {out}")
    lines = path.read_text(encoding="utf-8").splitlines()
    try:
        header = jsonio.loads(lines[0]) if lines else {}
    except ValueError:             # not JSON, or nested past the parser (jsonio)
        header = {}
    if header.get("format") != FORMAT:
        raise BenchError(f"--resume: {path} is not an edgespec bench journal (bad or missing header line)")
    if header.get("version") != VERSION:
        raise BenchError(f"--resume: {path} is a version {header.get('version')} journal (an older edgespec); this "
                         f"one reads version {VERSION}: start a new run in another --report directory")
    have = {**FINGERPRINT_DEFAULTS, **header.get("fingerprint", {})}
    if have.get("prompts_sha256") != expected.get("prompts_sha256"):
        raise BenchError(f"--resume: the prompts changed since the run in {out} was journaled (their sha256 "
                         f"differs): restore them, or start a new run in another --report directory")
    differ = [k for k in expected if json.dumps(have.get(k), sort_keys=True) != json.dumps(expected[k], sort_keys=True)]
    if differ:
        detail = "; ".join(f"{k}: journal {have.get(k)!r}, now {expected[k]!r}" for k in differ)
        raise BenchError(f"--resume: the settings differ from the run in {out} ({detail}); resume with the same "
                         "settings, or start a new run in another --report directory")
    records = []
    for n, line in enumerate(lines[1:], start=2):
        try:
            records.append(jsonio.loads(line))
        except ValueError:             # not JSON, or nested past the parser (jsonio)
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
            f.write(json.dumps({"format": FORMAT, "version": VERSION, "fingerprint": fp}) + "\n")
            for rec in records or []:
                f.write(json.dumps(rec) + "\n")
        tmp.replace(self.path)
        self._file = open(self.path, "a", encoding="utf-8")

    def append(self, rec: dict) -> None:
        self._file.write(json.dumps(rec) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()
