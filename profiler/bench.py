"""`edgespec bench`: measured speedup and MBSU per (strategy, draft length) on one execution provider.

Procedure (torch-free):
1. check every setting (strategies, options, draft lengths, sampling arguments), load and filter the prompts
   (`edgespec.calibrate.prompts`: HumanEval or Spec-Bench-style jsonl; the deterministic calib/test split
   applies to humaneval by default, a user's file is used whole), and check the report directory is writable;
2. load the bundle, check each strategy against it, then create ONE target session and ONE drafter session
   for the rows that draft with a model, and ONE target session, spinning as a target-only decoder's does,
   for the rows that do not (ar, ngram); every configuration (each strategy x draft length, "auto"
   included) is a decoder sharing its family's sessions (`decoder_family`): memory does not grow with them;
3. a NumPy stream-read test gives this machine's read bandwidth;
4. warm-up: one short generation per configuration (not recorded);
5. measure: for each repeat, for each prompt, every configuration in turn (ar first), so machine drift
   hits them alike; each generation's stats become a record; tqdm shows progress and the ETA; (a) the
   answer store is on (`--option answer_store_mb=0`: off), one draft_scope per row and repeat, so a row
   drafts only from its answers to OTHER prompts earlier in the run (a server that answered other chats);
6. summarise (aggregate.py) and write report.json, report.md and the plots (report.py).
Each generation is also appended to REPORT/records.jsonl as it is measured (journal.py), so a run that is
killed loses nothing and `--resume` continues it. Ctrl-C during step 5 stops measuring; what was measured
is summarised and written with "partial": true. A bench that fails before measuring anything removes what
it created in REPORT (the directory too, if this run made it).
"""
from __future__ import annotations

import hashlib
import os
from argparse import ArgumentTypeError
import sys
import time
from pathlib import Path
from typing import Callable

import numpy as np
from tqdm import tqdm

from edgespec.calibrate.prompts import HUMANEVAL, SPLITS, empty_split_message, load_prompts, split_prompts
from edgespec.errors import GenerationError
from edgespec.profiler import journal
from edgespec.profiler import report as R
from edgespec.profiler.aggregate import summarise
from edgespec.profiler.errors import BenchError
from edgespec.profiler.machine import peak_rss_mb, read_bandwidth, reset_peak_rss
from edgespec.profiler.peers import make_peers
from edgespec.profiler.settings import FAST_BASELINE, BenchSettings, gamma_label, is_auto
from edgespec.runtime.arguments import parse_option
from edgespec.runtime.bundle.bundle import Bundle
from edgespec.runtime.api.config import SESSION_OPTIONS, check_decoder_settings, split_options
from edgespec.runtime.api.checks import MAX_DRAFT_LENGTH, check_draft_length, check_generation_args
from edgespec.runtime.api.decoder import SpeculativeDecoder
from edgespec.runtime.planning.device_plan import profile_measured_again, wait_for_profile
from edgespec.runtime.planning.device_profile import device_plan_summary
from edgespec.runtime.bundle.manifest import manifest_sha256
from edgespec.runtime.engine.sessions import prefill_graph_applies
from edgespec.runtime.round.strategies import get_strategy

RECORD_STATS = ("new_tokens", "prefill_tokens", "prompt_tokens", "total_ms", "ttft_ms", "prefill_ms",
                "draft_prefill_ms", "draft_prefill_tokens", "draft_refills", "reused_tokens", "draft_ms",
                "verify_ms", "overhead_ms", "sampler_ms", "target_forwards", "verify_forwards", "draft_forwards", "drafted",
                "accepted", "guesses", "guesses_accepted", "drafter_resyncs", "drafter_fallback_steps", "fallback_ms", "stop_reason", "providers",
                "fallbacks", "store_drafted", "store_accepted")
STEP_LISTS = ("accepted_per_step", "drafted_per_step", "gamma_per_step")     # kept for drafting rows only
WARMUP_TOKENS = 8


# --------------------------------------------------------------------------- checks

def check_settings(s: BenchSettings) -> None:
    """Every setting that needs no bundle, before anything is loaded or created."""
    if not s.strategies:
        raise BenchError("give at least one strategy (--strategies ar,tli,...)")
    if len(set(s.strategies)) != len(s.strategies):
        raise BenchError(f"--strategies lists a strategy twice: {','.join(s.strategies)}")
    for label in s.strategies:
        name, opts = parse_strategy(label)
        check_row(label, get_strategy(name), {**s.options, **opts})
    if any(st != "ar" for st in s.strategies):
        check_draft_lengths(s.draft_lengths)
    m = s.max_draft_length
    if isinstance(m, bool) or not isinstance(m, int) or not 1 <= m <= MAX_DRAFT_LENGTH:
        raise BenchError(f"max_draft_length must be an integer in [1, {MAX_DRAFT_LENGTH}], got {m!r}")
    for name, value, low in (("--repeats", s.repeats, 1), ("--max-new-tokens", s.max_new_tokens, 1)):
        if isinstance(value, bool) or int(value) != value or value < low:
            raise BenchError(f"{name} must be an integer >= {low}, got {value!r}")
    if not (s.temperature >= 0):
        raise BenchError(f"--temperature must be >= 0, got {s.temperature}")
    check_generation_args(int(s.max_new_tokens), s.temperature, s.top_k, s.top_p, s.seed, None)
    if s.limit is not None and s.limit < 1:
        raise BenchError(f"--limit must be >= 1, got {s.limit}")


def check_draft_lengths(values) -> None:
    """Integers in [1, 64] (the runtime's check_draft_length) and/or "auto", each once."""
    def refuse():
        return BenchError(f"--draft-length needs integers in [1, {MAX_DRAFT_LENGTH}] and/or auto, got "
                          f"{','.join(map(str, values or [])) or 'none'}")
    if not values:
        raise refuse()
    for g in values:
        if is_auto(g):
            continue
        if isinstance(g, bool) or not isinstance(g, (int, float)) or int(g) != g:
            raise refuse()
        try:
            check_draft_length(int(g))
        except GenerationError:
            raise refuse() from None
    labels = [gamma_label(g if is_auto(g) else int(g)) for g in values]
    if len(set(labels)) != len(labels):
        raise BenchError(f"--draft-length lists a draft length twice: {','.join(labels)}")


def check_row(label: str, strat, opts: dict) -> None:
    """A row's options: SpeculativeDecoder's checks (config.check_decoder_settings), said for the row; the
    sessions' settings and max_draft_length are the whole bench's."""
    if strat.name == "ar" and label not in ("ar", FAST_BASELINE[0]):
        raise BenchError(f"strategy {label!r}: ar takes no options (ar-fast is ar with 1-token steps)")
    for key in opts:
        if key in SESSION_OPTIONS or key == "max_draft_length":
            raise BenchError(f"strategy {label!r}: {key} is not a row's option (bench: --option {key}=VALUE; "
                             "the drafter is built up front)")
    row = {k: v for k, v in opts.items() if k != "draft_probability"}
    try:
        check_decoder_settings(strat.name, options=row,
                               draft_probability=None if strat.name == "ar" else opts.get("draft_probability"))
    except GenerationError as exc:
        raise BenchError(f"strategy {label!r}: {exc}") from None


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


def select_prompts(s: BenchSettings) -> tuple[list, str]:
    """The prompts of the chosen split and categories, non-empty ones only, at most `limit`, and the sha256
    of the prompts' content (the journal's fingerprint). An empty result names the filter that emptied it."""
    if s.split not in SPLITS:
        raise BenchError(f"unknown split {s.split!r}; use one of {', '.join(SPLITS)}")
    every = load_prompts(s.prompts, "all")
    digest = journal.prompts_sha256(s.prompts, None if s.prompts == HUMANEVAL else s.prompts, every)
    if s.categories:
        have = sorted({p.category for p in every})
        unknown = [c for c in s.categories if c not in have]
        if unknown:
            raise BenchError(f"unknown categor{'y' if len(unknown) == 1 else 'ies'} {', '.join(map(repr, unknown))} "
                             f"in {s.prompts}; it has: {', '.join(have)}")
    prompts = split_prompts(every, s.split)
    if not prompts:
        raise BenchError("no prompts left: " + empty_split_message(s.prompts, every, s.split, "--split"))
    if s.categories:
        left = sorted({p.category for p in prompts})
        prompts = [p for p in prompts if p.category in s.categories]
        if not prompts:
            raise BenchError(f"no prompts left: the {s.split} split of {s.prompts} has none in --category "
                             f"{','.join(s.categories)} (it has: {', '.join(left)})")
    usable = [p for p in prompts if p.text and p.text.strip()]
    if not usable:
        raise BenchError(f"no usable prompts in {s.prompts} (split {s.split}): every prompt text is empty")
    return (usable[: s.limit] if s.limit else usable), digest


# --------------------------------------------------------------------------- decoders sharing sessions

def parse_strategy(label: str) -> tuple[str, dict]:
    """`NAME[:KEY=VALUE...]` -> (NAME, options), e.g. `rdk-taylor:rdk_beta=1000` or
    `tli:draft_probability=auto`: the same strategy with other options is its own row in one run; values
    as --option reads them (runtime/arguments.py). `ar-fast` is ar with plain_steps=fast (1-token steps)."""
    if label == FAST_BASELINE[0]:
        return "ar", {"plain_steps": "fast"}
    name, *items = label.split(":")
    try:
        return name, dict(parse_option(item) for item in items)
    except ArgumentTypeError as exc:
        raise BenchError(f"strategy {label!r}: {exc}") from None


def _decoder_length(gamma):
    return gamma if is_auto(gamma) else max(int(gamma), 1)        # ar's 0: any length, it drafts nothing


def decoder_family(bundle, configs: list[tuple], s: BenchSettings) -> dict:
    """{(strategy label, draft-length setting): decoder}. Rows that draft with the model share one target and
    one drafter session (SpeculativeDecoder.variant: generations run one at a time, each resets the KV);
    rows without (ar, ngram) share a target session of their own, spinning as a target-only decoder's does
    (beside a drafter the threads stop after each run, about 2% slower: a flattering baseline; sessions.py).
    Every strategy is checked against the bundle before any session is created."""
    rows = {}                                 # label -> (strategy name, its options over --option's)
    for label, _ in configs:
        name, opts = parse_strategy(label)
        rows[label] = (name, {} if name == "ar" else {**s.options, **opts})
    for label, (name, opts) in rows.items():
        strat = get_strategy(name)
        check_row(label, strat, opts)
        if strat.check:
            strat.check(bundle, split_options({k: v for k, v in opts.items() if k != "draft_probability"})[2])
        if opts.get("draft_probability") == "auto" and bundle.a_star is None:
            raise GenerationError("draft_probability='auto' needs a calibrated a* in the bundle (vocab/randomised.json)")
    drafting = [key for key in configs if get_strategy(rows[key[0]][0]).uses_drafter]
    out = {}
    for family in [f for f in (drafting, [k for k in configs if k not in drafting]) if f]:
        first = family[0]
        name, opts = rows[first[0]]
        options = {k: v for k, v in opts.items() if k != "draft_probability"}
        base = SpeculativeDecoder(bundle, strategy=name, draft_length=_decoder_length(first[1]), ep=s.ep,
                                  threads=s.threads, draft_probability=opts.get("draft_probability"),
                                  prefill_graph=s.prefill_graph,
                                  options=dict(draft_ep=s.draft_ep, draft_threads=s.draft_threads,
                                               max_draft_length=s.max_draft_length, prefix_reuse=False,
                                               defer_drafter=False, **options))
        for key in family:                    # a row without draft_confidence has none
            out[key] = base if key == first else \
                base.variant(rows[key[0]][0], _decoder_length(key[1]), **{"draft_confidence": None, **rows[key[0]][1]})
    return {key: out[key] for key in configs}


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


def _generate(dec, ids, s: BenchSettings, max_new: int, seed: int | None, scope: str | None = None):
    return dec.generate(ids, max_new_tokens=max_new, temperature=s.temperature, top_k=s.top_k, top_p=s.top_p,
                        seed=seed, draft_scope=scope)


def record(res, repeat: int, prompt, key: tuple, rss_mb: float) -> dict:
    """One generation's record. `draft_length_setting` is the row's setting (int gamma, 0 for ar, or "auto");
    `draft_length` the gamma it ran with: the setting, or for "auto" the mean gamma chosen per round."""
    d = res.stats.to_dict()
    gammas = list(d.get("gamma_per_step") or [])
    mean = float(np.mean(gammas)) if gammas else None
    rec = {"repeat": repeat, "prompt_id": prompt.id, "category": prompt.category, "strategy": key[0],
           "draft_length": mean if is_auto(key[1]) else key[1], "draft_length_setting": key[1],
           **{k: d[k] for k in RECORD_STATS}, "peak_rss_mb": rss_mb}
    rec["draft_ms_steps"] = list(d.get("draft_ms_steps") or [])
    rec["decode_ms_steps"] = list((d.get("verify_ms_by_k") or {}).get("1", []))
    for name in STEP_LISTS:                  # per round; ar's are all zeros, not worth a journal line
        rec[name] = list(d.get(name) or []) if key[1] != 0 else []
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
            bar.set_postfix_str(f"rep {rep + 1} {prompt.id} {key[0]} g={gamma_label(key[1])}", refresh=False)
            reset_peak_rss()
            res = _generate(decoders[key], ids, s, s.max_new_tokens, seed, f"{key[0]}/{key[1]}/{rep}")  # (a)
            records.append(record(res, rep, prompt, key, peak_rss_mb()))
            wait_for_profile(decoders[key])            # a stale device profile measured again: not beside a row
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
        wait_for_profile(dec)


def run_bench(s: BenchSettings, hook: Callable[[dict], None] | None = None) -> dict:
    """Run the whole benchmark and write the report; returns the report document. Settings are checked
    before anything is created; a bench that fails before its first generation is journaled removes the files
    it created in the report directory, and the directory (with any parents) if it created them."""
    t0 = time.time()
    check_settings(s)
    prompts, prompts_digest = select_prompts(s)
    report = Path(s.report).expanduser()
    new_dirs = _missing_dirs(report)
    before = {p.name for p in report.iterdir()} if report.is_dir() else set()
    measured: list[dict] = []
    try:
        return _bench(s, check_report_dir(report), prompts, prompts_digest, hook, measured, t0)
    except BaseException:
        if not measured:
            _remove_created(report, before, new_dirs)
        raise


def _bench(s: BenchSettings, out: Path, prompts: list, prompts_digest: str, hook, measured: list, t0: float) -> dict:
    bundle = Bundle.load(s.bundle, verify=s.verify)
    fp = journal.fingerprint(s, manifest_sha256(s.bundle), prompts_digest,
                             prefill_graph_applies(bundle, s.ep))
    done = journal.read(out, fp) if s.resume else None
    configs = s.configs()
    log = journal.Journal(out, fp, done)       # before the sessions: refuses to overwrite an earlier run's journal

    def keep(rec: dict) -> None:
        log.append(rec)
        measured.append(rec)
        if hook is not None:
            hook(rec)
    peers = make_peers(bundle, s) if s.peers or s.llama_server else {}
    try:
        device = device_plan_summary(bundle, s.threads, s.ep, progress=s.progress)   # before the decoders: they plan from it
        decoders = decoder_family(bundle, configs, s)
        if FAST_BASELINE not in decoders and decoders[("ar", 0)].target.min_tokens > 1:
            decoders[FAST_BASELINE] = decoders[("ar", 0)].variant("ar", plain_steps="fast")
            configs.insert(1, FAST_BASELINE)
        for label, peer in peers.items():
            decoders[(label, 0)] = peer
            configs.append((label, 0))
        encoded, skipped = encode_prompts(decoders[("ar", 0)], prompts, s)
        if skipped:
            print(f"edgespec: warning: {len(skipped)} prompt(s) skipped (prompt + max_new_tokens over the context)",
                  file=sys.stderr)
        bandwidth = read_bandwidth(s.bandwidth_mb)
        if done:                 # a resumed run may have been given fewer prompts or repeats: keep those records
            plan = {(rep, p.id, *key) for rep in range(s.repeats) for p, _ in encoded for key in decoders}
            done = [r for r in done if journal.record_key(r) in plan]
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
        for peer in peers.values():
            peer.close()                      # removes its scratch directory
    if done:
        print(f"edgespec: resumed: {len(done)} generation(s) from the journal, {len(records) - len(done)} measured "
              "now", file=sys.stderr)
    measured.append(None)                      # from here on the run's files stay, whatever happens
    gbs = bandwidth["gbs"] if bandwidth else None
    runs = summarise(records, configs, bundle.manifest, gbs)
    doc = R.build_report(s, bundle, runs, records, bandwidth, partial, [p.id for p, _ in encoded], skipped,
                         time.time() - t0)
    doc["resumed_generations"] = len(done or [])
    device["profile_measured_again"] = profile_measured_again(decoders.values())
    doc["device_plan"] = device
    R.write_report(doc, out, progress=s.progress)
    return doc


def _missing_dirs(path: Path) -> list[Path]:
    """The directories mkdir(parents=True) would create for `path`, deepest first."""
    out, p = [], path.absolute()
    while not p.exists() and p != p.parent:
        out.append(p)
        p = p.parent
    return out


def _remove_created(report: Path, before: set, new_dirs: list[Path]) -> None:
    """Undo what a failed run created: files in `report` that were not there before, then the directories
    it made (only while empty). Never a pre-existing directory or a file this run did not create."""
    try:
        for p in report.iterdir():
            if p.name not in before and (p.is_file() or p.is_symlink()):
                p.unlink()
    except OSError:
        pass
    for d in new_dirs:
        try:
            d.rmdir()
        except OSError:
            break
