"""`edgespec bench`: measured speedup and MBSU per (strategy, draft length) on one execution provider.

Procedure (torch-free):
1. check the settings and that the report directory is writable; load and filter the prompts
   (`edgespec.calibrate.prompts`: HumanEval or Spec-Bench-style jsonl, deterministic calib/test split);
2. load the bundle and create ONE target session and ONE drafter session; every configuration
   (ar, and each strategy x draft length) is a decoder sharing them (`decoder_family`), so memory does
   not grow with the number of configurations and all see the same sessions;
3. a NumPy stream-read test gives this machine's read bandwidth;
4. warm-up: one short generation per configuration (not recorded);
5. measure: for each repeat, for each prompt, every configuration in turn (ar first), so machine drift
   hits them alike; each generation's stats become a record; tqdm shows progress and the ETA;
6. summarise (aggregate.py) and write report.json, report.md and the plots (report.py).
Each generation is also appended to REPORT/records.jsonl as it is measured (journal.py), so a run that is
killed loses nothing and `--resume` continues it. Ctrl-C during step 5 stops measuring; what was measured
is summarised and written with "partial": true.
"""
from __future__ import annotations

import hashlib
import os
import sys
import time
from pathlib import Path
from typing import Callable

import numpy as np
from tqdm import tqdm

from edgespec.calibrate.prompts import SPLITS, load_prompts
from edgespec.profiler import journal
from edgespec.profiler import report as R
from edgespec.profiler.aggregate import summarise
from edgespec.profiler.errors import BenchError
from edgespec.profiler.machine import peak_rss_mb, read_bandwidth, reset_peak_rss
from edgespec.profiler.settings import BenchSettings
from edgespec.runtime.bundle import Bundle
from edgespec.runtime.decoder import SpeculativeDecoder
from edgespec.runtime.manifest import manifest_sha256
from edgespec.runtime.strategies import get_strategy

RECORD_STATS = ("new_tokens", "prefill_tokens", "prompt_tokens", "total_ms", "ttft_ms", "prefill_ms", "draft_ms",
                "verify_ms", "overhead_ms", "sampler_ms", "target_forwards", "verify_forwards", "draft_forwards", "drafted",
                "accepted", "drafter_resyncs", "drafter_fallback_steps", "stop_reason", "providers", "fallbacks")
WARMUP_TOKENS = 8


# --------------------------------------------------------------------------- checks

def check_settings(s: BenchSettings) -> None:
    if not s.strategies:
        raise BenchError("give at least one strategy (--strategies ar,tli,...)")
    if len(set(s.strategies)) != len(s.strategies):
        raise BenchError(f"--strategies lists a strategy twice: {','.join(s.strategies)}")
    if any(st != "ar" for st in s.strategies):
        if not s.draft_lengths or any(isinstance(g, bool) or int(g) != g or g < 1 for g in s.draft_lengths):
            raise BenchError(f"--draft-length needs integers >= 1, got {s.draft_lengths}")
    for name, value, low in (("--repeats", s.repeats, 1), ("--max-new-tokens", s.max_new_tokens, 1)):
        if isinstance(value, bool) or int(value) != value or value < low:
            raise BenchError(f"{name} must be an integer >= {low}, got {value!r}")
    if not (s.temperature >= 0):
        raise BenchError(f"--temperature must be >= 0, got {s.temperature}")
    if s.limit is not None and s.limit < 1:
        raise BenchError(f"--limit must be >= 1, got {s.limit}")


def check_report_dir(path: Path) -> Path:
    """Create the report directory and prove it writable (before any model is loaded)."""
    path = Path(path).expanduser()
    probe = path / f".edgespec-write-test-{os.getpid()}"
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe.write_bytes(b"ok")
        probe.unlink()
    except OSError as exc:
        raise BenchError(f"report directory {path} is not writable ({exc.strerror or exc})") from None
    return path


def select_prompts(s: BenchSettings) -> list:
    """The prompts of the chosen split and categories, non-empty ones only, at most `limit`."""
    if s.split not in SPLITS:
        raise BenchError(f"unknown split {s.split!r}; use one of {', '.join(SPLITS)}")
    prompts = load_prompts(s.prompts, s.split)
    if s.categories:
        have = sorted({p.category for p in prompts})
        unknown = [c for c in s.categories if c not in have]
        if unknown:
            raise BenchError(f"unknown categor{'y' if len(unknown) == 1 else 'ies'} {', '.join(map(repr, unknown))} "
                             f"in {s.prompts} (split {s.split}); it has: {', '.join(have)}")
        prompts = [p for p in prompts if p.category in s.categories]
    usable = [p for p in prompts if p.text and p.text.strip()]
    if not usable:
        raise BenchError(f"no usable prompts in {s.prompts} (split {s.split}): every prompt text is empty")
    return usable[: s.limit] if s.limit else usable


# --------------------------------------------------------------------------- decoders sharing sessions

def parse_strategy(label: str) -> tuple[str, dict]:
    """`NAME[:KEY=VALUE...]` -> (NAME, options), e.g. `rdk-taylor:rdk_beta=1000` or
    `tli:draft_probability=auto`: the same strategy with other options is its own row in one run."""
    name, *items = label.split(":")
    return name, parse_options(items, f"strategy {label!r}")


def parse_options(items: list[str] | None, where: str = "--strategy-option") -> dict:
    """KEY=VALUE strings -> {key: bool | int | float | str} (true/false are booleans)."""
    out = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise BenchError(f"{where}: expected KEY=VALUE, got {item!r}")
        if value.lower() in ("true", "false"):
            out[key] = value.lower() == "true"
            continue
        try:
            out[key] = float(value) if any(c in value for c in ".eE") else int(value)
        except ValueError:
            out[key] = value
    return out


def decoder_family(bundle, configs: list[tuple[str, int]], s: BenchSettings) -> dict:
    """{(strategy label, gamma): decoder}, all sharing one target and (if any strategy drafts) one drafter
    session (SpeculativeDecoder.variant: generations run one at a time and each resets both KV runners).
    Every strategy is checked against the bundle here, before anything is measured."""
    parsed = {}                               # label -> (strategy name, its options over --strategy-option)
    for label, _ in configs:
        name, opts = parse_strategy(label)
        parsed[label] = (name, {**s.options, **opts})
    drafting = [(st, g) for st, g in configs if get_strategy(parsed[st][0]).uses_drafter]
    first = drafting[0] if drafting else ("ar", 0)
    name, opts = parsed[first[0]]
    base = SpeculativeDecoder(bundle, strategy=name, draft_length=max(first[1], 1), ep=s.ep, draft_ep=s.draft_ep,
                              threads=s.threads, draft_threads=s.draft_threads, **opts)
    return {key: (base if key == first else
                  base.variant(strategy=parsed[key[0]][0], draft_length=max(key[1], 1), **parsed[key[0]][1]))
            for key in configs}


# --------------------------------------------------------------------------- measuring

def encode_prompts(dec, prompts: list, s: BenchSettings) -> tuple[list, list]:
    """[(prompt, target ids)] that fit the context with max_new_tokens, and the ids of those that do not."""
    limit = dec.target.max_position
    kept, skipped = [], []
    for p in prompts:
        ids = dec.encode_prompt(p.text, chat=s.chat)
        if limit and len(ids) + s.max_new_tokens > limit:
            skipped.append(p.id)
        else:
            kept.append((p, ids))
    if not kept:
        raise BenchError(f"no usable prompts: all {len(prompts)} exceed the context length {limit} with "
                         f"--max-new-tokens {s.max_new_tokens}")
    return kept, skipped


def _generate(dec, ids, s: BenchSettings, max_new: int, seed: int | None):
    return dec.generate(ids, max_new_tokens=max_new, temperature=s.temperature, top_k=s.top_k, top_p=s.top_p,
                        seed=seed)


def record(res, repeat: int, prompt, key: tuple, rss_mb: float) -> dict:
    d = res.stats.to_dict()
    rec = {"repeat": repeat, "prompt_id": prompt.id, "category": prompt.category, "strategy": key[0],
           "draft_length": key[1], **{k: d[k] for k in RECORD_STATS}, "peak_rss_mb": rss_mb}
    rec["draft_ms_steps"] = list(d.get("draft_ms_steps") or [])
    rec["decode_ms_steps"] = list((d.get("verify_ms_by_k") or {}).get("1", []))
    rec["output_sha256"] = hashlib.sha256(np.asarray(res.token_ids, dtype=np.int64).tobytes()).hexdigest()
    return rec


def measure(decoders: dict, encoded: list, s: BenchSettings, hook: Callable[[dict], None] | None = None,
            done: list[dict] | None = None):
    """Interleaved measurement, skipping the generations in `done` (a resumed run's records, which head the
    returned list). Returns (records, partial); Ctrl-C ends it early with partial=True."""
    measured = {journal.record_key(r) for r in done or []}
    todo = [(rep, i, key) for rep in range(s.repeats) for i in range(len(encoded)) for key in decoders
            if (rep, encoded[i][0].id, *key) not in measured]
    bar = tqdm(total=len(todo), desc="bench", unit="gen", disable=not s.progress, dynamic_ncols=True,
               file=sys.stderr)
    records: list[dict] = list(done or [])
    try:
        for rep, i, key in todo:
            prompt, ids = encoded[i]
            seed = None if s.temperature == 0 else s.seed + 100_003 * rep + i
            bar.set_postfix_str(f"rep {rep + 1} {prompt.id} {key[0]} g={key[1]}", refresh=False)
            reset_peak_rss()
            res = _generate(decoders[key], ids, s, s.max_new_tokens, seed)
            records.append(record(res, rep, prompt, key, peak_rss_mb()))
            bar.update(1)
            if hook is not None:
                hook(records[-1])
    except KeyboardInterrupt:
        bar.close()
        print(f"edgespec: interrupted: writing the {len(records)} generation(s) measured so far (partial)",
              file=sys.stderr)
        return records, True
    bar.close()
    return records, False


def warm_up(decoders: dict, ids: list[int], s: BenchSettings) -> None:
    for dec in decoders.values():
        _generate(dec, ids, s, min(WARMUP_TOKENS, s.max_new_tokens), s.seed)


def run_bench(s: BenchSettings, hook: Callable[[dict], None] | None = None) -> dict:
    """Run the whole benchmark and write the report; returns the report document."""
    t0 = time.time()
    check_settings(s)
    out = check_report_dir(s.report)
    prompts = select_prompts(s)
    bundle = Bundle.load(s.bundle, verify=s.verify)
    fp = journal.fingerprint(s, manifest_sha256(s.bundle))
    done = journal.read(out, fp) if s.resume else None
    configs = s.configs()
    decoders = decoder_family(bundle, configs, s)
    encoded, skipped = encode_prompts(decoders[("ar", 0)], prompts, s)
    if skipped:
        print(f"edgespec: warning: {len(skipped)} prompt(s) skipped (prompt + max_new_tokens over the context)",
              file=sys.stderr)
    bandwidth = read_bandwidth(s.bandwidth_mb)
    log = journal.Journal(out, fp, done)
    if done:                     # a resumed run may have been given fewer prompts or repeats: keep those records
        plan = {(rep, p.id, *key) for rep in range(s.repeats) for p, _ in encoded for key in decoders}
        done = [r for r in done if journal.record_key(r) in plan]

    def keep(rec: dict) -> None:
        log.append(rec)
        if hook is not None:
            hook(rec)
    try:
        if s.warmup:
            warm_up(decoders, encoded[0][1], s)
    except KeyboardInterrupt:
        print("edgespec: interrupted during the warm-up: nothing new measured (partial)", file=sys.stderr)
        records, partial = list(done or []), True
    else:
        records, partial = measure(decoders, encoded, s, keep, done)
    finally:
        log.close()
    if done:
        print(f"edgespec: resumed: {len(done)} generation(s) from the journal, {len(records) - len(done)} measured "
              "now", file=sys.stderr)
    gbs = bandwidth["gbs"] if bandwidth else None
    runs = summarise(records, configs, bundle.manifest, gbs)
    doc = R.build_report(s, bundle, runs, records, bandwidth, partial, [p.id for p, _ in encoded], skipped,
                         time.time() - t0)
    doc["resumed_generations"] = len(done or [])
    R.write_report(doc, out, progress=s.progress)
    return doc

