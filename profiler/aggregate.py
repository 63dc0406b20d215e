"""Per-generation records -> one summary per (strategy, draft_length), as in docs/report-schema.md.

A record is one `generate` call: the prompt, the repeat, the configuration and its GenerationStats
fields. Within a repeat a configuration is compared with `ar` on the prompts both completed, so a
partial (interrupted) bench still compares like with like. Measured quantities are summarised per
repeat, and the run reports their median over repeats (and [min, max] as the spread); the derived
quantities (c_time, MBSU, realisation, bandwidth fraction) are computed from those reported medians, so a
report is self-consistent: mbsu_time == tau / (c_time * draft_length + 1) holds for the printed values.

The speed baseline is the fastest plain decoding of the same graph: `ar-fast` (1-token steps) where
the bench measured it (graphs that pad 1-token steps for exactness), else `ar`. `speedup` is end to end
(tokens / total time, prefill and TTFT included) and `decode_speedup` is the decode rate (tokens after
the first / (total - TTFT)), both over that baseline on the same prompts. The lossless check compares
greedy outputs with `ar`, the exact reference; ar-fast is compared with `ar` too (how often padding
changes the greedy output), peer rows with the baseline (the same graph on the same path).

A configuration is (strategy label, draft-length setting): an int gamma (0 for ar) or "auto". An auto row's
`draft_length` is the mean gamma the governor chose per round, pooled over the row's generations, and its
MBSU uses that mean. The drafting statistics (acceptance by draft position, zero-accept share, gamma chosen,
time in fallback) are pooled over the row's generations (`drafting_stats`), like onnxruntime-genai's.
A strategy that drafts without a model (ngram) has c = 0: MBSU = tau.
"""
from __future__ import annotations

from collections import Counter

from edgespec.profiler import mbsu as M
from edgespec.profiler.journal import config_of
from edgespec.profiler.peers import is_peer
from edgespec.profiler.settings import FAST_BASELINE, is_auto
from edgespec.runtime.round.strategies import get_strategy

# summarised per repeat, reported as the median over repeats with a [min, max] spread
MEDIAN_FIELDS = ("acceptance_rate", "guess_acceptance", "tau", "tokens_per_s", "speedup", "decode_tokens_per_s", "decode_speedup",
                 "ttft_ms", "ttft_ratio", "tpot_ms", "draft_step_ms", "draft_prefill_ms", "reused_tokens",
                 "target_decode_ms", "bandwidth_gbs", "prefill_ms_per_token", "draft_ms_per_token",
                 "verify_ms_per_token", "overhead_ms_per_token", "overhead_share", "sampler_share")


def _sum(recs, key) -> float:
    return float(sum(r[key] for r in recs))


def _pooled_median(recs, key) -> float | None:
    return M.median(v for r in recs for v in r.get(key) or [])


def repeat_summary(recs: list[dict], ar_recs: list[dict], gamma, manifest: dict) -> dict:
    """Summary of one configuration over one repeat's prompts (recs and ar_recs: the same prompts); gamma:
    the draft-length setting (0: ar, nothing drafted)."""
    tokens, total = _sum(recs, "new_tokens"), _sum(recs, "total_ms")
    ar_tokens, ar_total = _sum(ar_recs, "new_tokens"), _sum(ar_recs, "total_ms")
    drafted, accepted = _sum(recs, "drafted"), _sum(recs, "accepted")
    verify_fw = _sum(recs, "verify_forwards")
    guesses = sum(r.get("guesses") or 0 for r in recs)         # absent from journals before plain_guess
    decode_tokens = tokens - _sum(recs, "prefill_tokens")
    tps = 1e3 * tokens / total if total > 0 else None
    ar_tps = 1e3 * ar_tokens / ar_total if ar_total > 0 else None
    dec_tps, ar_dec_tps = _decode_rate(recs), _decode_rate(ar_recs)
    draft_step = _pooled_median(recs, "draft_ms_steps") if gamma else None
    decode_ms = _pooled_median(ar_recs, "decode_ms_steps")
    weight_bytes = M.weight_bytes_read(manifest, int(_sum(recs, "target_forwards")), int(_sum(recs, "draft_forwards")))
    out = {
        "prompts": len(recs), "new_tokens": int(tokens), "total_ms": total,
        "ar_new_tokens": int(ar_tokens), "ar_total_ms": ar_total,
        "drafted": int(drafted), "accepted": int(accepted), "verify_forwards": int(verify_fw),
        "acceptance_rate": accepted / drafted if drafted else None,
        "guesses": int(guesses),
        "guess_acceptance": sum(r.get("guesses_accepted") or 0 for r in recs) / guesses if guesses else None,
        "tau": decode_tokens / verify_fw if verify_fw else None,
        "tokens_per_s": tps,
        "speedup": M.ratio(tps, ar_tps),
        "decode_tokens_per_s": dec_tps,
        "decode_speedup": M.ratio(dec_tps, ar_dec_tps),
        "ttft_ms": _sum(recs, "ttft_ms") / len(recs),
        "ttft_ratio": M.ratio(_sum(recs, "ttft_ms"), _sum(ar_recs, "ttft_ms")),
        "draft_prefill_ms": sum(r.get("draft_prefill_ms") or 0.0 for r in recs) / len(recs),
        "reused_tokens": sum(r.get("reused_tokens") or 0 for r in recs) / len(recs),
        "tpot_ms": (total - _sum(recs, "ttft_ms")) / decode_tokens if decode_tokens > 0 else None,
        "draft_step_ms": draft_step,
        "target_decode_ms": decode_ms,
        "c_time": M.c_time(draft_step, decode_ms) if gamma else None,
        "bandwidth_gbs": weight_bytes / (total / 1e3) / 1e9 if weight_bytes and total > 0 else None,
        "peak_rss_mb": max(r.get("peak_rss_mb") or 0.0 for r in recs),
        "overhead_share": M.ratio(_sum(recs, "overhead_ms"), total - _sum(recs, "prefill_ms")),
        "sampler_share": M.ratio(_sum(recs, "sampler_ms"), _sum(recs, "draft_ms")) if gamma else None,
    }
    for part in ("prefill", "draft", "verify", "overhead"):
        out[f"{part}_ms_per_token"] = _sum(recs, f"{part}_ms") / tokens if tokens else None
    return out


def _decode_rate(recs: list[dict]) -> float | None:
    """Tokens after the first per second of the time after it (TTFT excluded; a drafter's prefill,
    which runs after the first token, included)."""
    t = sum(r["total_ms"] - r["ttft_ms"] for r in recs)
    n = sum(r["new_tokens"] - r["prefill_tokens"] for r in recs)
    return 1e3 * n / t if t > 0 else None


def baseline_key(records: list[dict]) -> tuple:
    """The speed baseline's configuration: ar-fast where measured, else ar."""
    return FAST_BASELINE if any(config_of(r) == FAST_BASELINE for r in records) else ("ar", 0)


def _by_repeat_and_prompt(records: list[dict], key: tuple) -> dict:
    out: dict = {}
    for r in records:
        if config_of(r) == key:
            out.setdefault(r["repeat"], {})[r["prompt_id"]] = r
    return out


def _providers(recs: list[dict]) -> dict:
    out: dict[str, list[str]] = {}
    for r in recs:
        for role, names in (r.get("providers") or {}).items():
            for n in names:
                if n not in out.setdefault(role, []):
                    out[role].append(n)
    return out


def _category_summary(pairs: list[tuple[dict, dict]]) -> dict:
    out: dict[str, dict] = {}
    cats = sorted({rec["category"] for rec, _ in pairs})
    for cat in cats:
        sel = [(a, b) for a, b in pairs if a["category"] == cat]
        recs, ars = [a for a, _ in sel], [b for _, b in sel]
        s = repeat_summary(recs, ars, 0, {})
        out[cat] = {"generations": len(sel), "acceptance_rate": s["acceptance_rate"], "tau": s["tau"],
                    "tokens_per_s": s["tokens_per_s"], "speedup": s["speedup"]}
    return out


def summarise_config(records: list[dict], key: tuple, manifest: dict, stream_gbs: float | None) -> dict | None:
    """The report's run entry for configuration key = (strategy, draft_length); None if nothing measured."""
    strategy, gamma = key
    base_key = baseline_key(records)
    ref_key = base_key if is_peer(strategy) else ("ar", 0)     # what its tokens are compared with
    mine, base = _by_repeat_and_prompt(records, key), _by_repeat_and_prompt(records, base_key)
    reference = _by_repeat_and_prompt(records, ref_key)
    repeats, pairs, refs = [], [], []
    for rep in sorted(mine):
        common = [pid for pid in mine[rep] if pid in base.get(rep, {}) and pid in reference.get(rep, {})]
        if not common:
            continue
        recs = [mine[rep][p] for p in common]
        bases = [base[rep][p] for p in common]
        repeats.append({"repeat": rep, **repeat_summary(recs, bases, gamma, manifest)})
        pairs.extend(zip(recs, bases))
        refs.extend(reference[rep][p] for p in common)
    if not repeats:
        return None
    stats = drafting_stats([a for a, _ in pairs]) if gamma != 0 else dict.fromkeys(DRAFTING_FIELDS)
    run = {"strategy": strategy, "draft_length": stats["mean_gamma"] if is_auto(gamma) else gamma,
           "draft_length_setting": gamma, "repeats_measured": len(repeats),
           "prompts": max(r["prompts"] for r in repeats)}
    for f in MEDIAN_FIELDS:
        run[f] = M.median(r[f] for r in repeats)
    run["peak_rss_mb"] = max(r["peak_rss_mb"] for r in repeats)
    run.update(stats)
    run.update(derived(run, manifest, stream_gbs, uses_drafter(strategy)))
    run["spread"] = {f: _min_max([r[f] for r in repeats]) for f in (*MEDIAN_FIELDS, "c_time")}
    run["providers"] = _providers([p[0] for p in pairs])
    run["drafter_resyncs"] = int(sum(p[0].get("drafter_resyncs", 0) for p in pairs))
    # lossless check, free in every bench: greedy outputs must equal ar's token for token (0 here)
    run["outputs_differing_from_ar"] = sum(a.get("output_sha256") != b.get("output_sha256")
                                           for (a, _), b in zip(pairs, refs))
    run["compared_with"] = ref_key[0]
    run["by_category"] = _category_summary(pairs)
    run["repeats"] = repeats
    return run


def uses_drafter(label: str) -> bool:
    """Whether a strategy label's strategy runs the drafter model (ngram drafts by lookup, ar not at all)."""
    if is_peer(label) or label == FAST_BASELINE[0]:
        return False
    return get_strategy(label.split(":")[0]).uses_drafter


def derived(run: dict, manifest: dict, stream_gbs: float | None, drafter: bool = True) -> dict:
    """c, MBSU, realisation and bandwidth fraction from a run's reported values (gamma: the row's draft
    length, for an auto row the mean gamma chosen). No drafter model (ngram): c = 0, MBSU = tau."""
    gamma, tau = run["draft_length"], run["tau"]
    if run.get("draft_length_setting", gamma) == 0:
        c = {"c_params": None, "c_bytes": None, "c_time": None}
    elif not drafter:
        c = {"c_params": 0.0, "c_bytes": 0.0, "c_time": 0.0}
    else:
        c = {"c_params": M.c_params(manifest), "c_bytes": M.c_bytes(manifest),
             "c_time": M.c_time(run["draft_step_ms"], run["target_decode_ms"])}
    out = dict(c)
    for kind in ("params", "bytes", "time"):
        out[f"mbsu_{kind}"] = M.mbsu(tau, c[f"c_{kind}"], gamma) if gamma is not None else None
    out["realisation"] = M.ratio(run["speedup"], out["mbsu_time"])
    out["bandwidth_fraction"] = M.ratio(run["bandwidth_gbs"], stream_gbs)
    return out


DRAFTING_FIELDS = ("mean_gamma", "gamma_histogram", "drafting_rounds", "zero_accept_share", "acceptance_by_position",
                   "reached_by_position", "fallback_ms", "fallback_share")


def drafting_stats(recs: list[dict]) -> dict:
    """Pooled over the generations' rounds (records' accepted_per_step, drafted_per_step, gamma_per_step):
    - acceptance_by_position[j-1] = accepted / reached at draft position j, where a round "reached" j when
      it drafted >= j tokens and accepted >= j - 1 of them, and "accepted" j when it accepted >= j
      (reached_by_position holds the reached counts; null where none reached);
    - zero_accept_share: rounds that drafted something and accepted nothing / rounds that drafted something;
    - mean_gamma and gamma_histogram {gamma: rounds}: the draft length chosen per round (auto: the governor's);
    - fallback_share: Σ fallback_ms (rounds run with gamma 0) / Σ decode ms (total_ms - ttft_ms)."""
    acc = [a for r in recs for a in r.get("accepted_per_step") or []]
    dra = [d for r in recs for d in r.get("drafted_per_step") or []]
    gammas = [g for r in recs for g in r.get("gamma_per_step") or []]
    drafting = [a for d, a in zip(dra, acc) if d > 0]
    by_pos, reached_by_pos = [], []
    for j in range(1, max(dra, default=0) + 1):
        reached = [a >= j for d, a in zip(dra, acc) if d >= j and a >= j - 1]
        by_pos.append(sum(reached) / len(reached) if reached else None)
        reached_by_pos.append(len(reached))
    fallback = float(sum(r.get("fallback_ms") or 0.0 for r in recs))
    return {"mean_gamma": sum(gammas) / len(gammas) if gammas else None,
            "gamma_histogram": {str(g): n for g, n in sorted(Counter(gammas).items())},
            "drafting_rounds": len(drafting),
            "zero_accept_share": sum(a == 0 for a in drafting) / len(drafting) if drafting else None,
            "acceptance_by_position": by_pos, "reached_by_position": reached_by_pos,
            "fallback_ms": fallback,
            "fallback_share": M.ratio(fallback, sum(r["total_ms"] - r["ttft_ms"] for r in recs))}


def _min_max(values: list) -> list | None:
    vals = [v for v in values if v is not None]
    return [min(vals), max(vals)] if vals else None


def summarise(records: list[dict], configs: list[tuple], manifest: dict, stream_gbs: float | None) -> list[dict]:
    runs = [summarise_config(records, key, manifest, stream_gbs) for key in configs]
    return [r for r in runs if r is not None]
