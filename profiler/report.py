"""The bench report: report.json (schema in docs/report-schema.md), report.md and PNG plots."""
from __future__ import annotations

import datetime as _dt
import json
import os
import sys
from pathlib import Path

from edgespec.profiler import mbsu as M
from edgespec.profiler.machine import machine_info, versions
from edgespec.profiler.settings import gamma_label, gamma_order, is_auto, settings_dict
from edgespec.runtime.bundle.manifest import manifest_sha256

FORMAT = "edgespec-bench-report"
SCHEMA_VERSION = 1
PLOT_SPEEDUP = "speedup_mbsu.png"
PLOT_CATEGORY = "acceptance_by_category.png"
GENERATION_FIELDS = ("repeat", "prompt_id", "category", "strategy", "draft_length", "draft_length_setting",
                     "new_tokens", "prompt_tokens", "total_ms", "ttft_ms", "prefill_ms", "draft_ms", "verify_ms",
                     "overhead_ms", "target_forwards", "verify_forwards", "draft_forwards", "drafted", "accepted",
                     "guesses", "guesses_accepted", "drafter_resyncs", "fallback_ms", "stop_reason", "peak_rss_mb", "sampler_ms", "output_sha256")


def setting(run: dict):
    """A run's draft-length setting: an int gamma (0: ar) or "auto"."""
    return run.get("draft_length_setting", run["draft_length"])


def gamma_text(run: dict) -> str:
    """γ as tables and plots show it: the integer, or "auto"."""
    return gamma_label(setting(run))


def drafts(run: dict) -> bool:
    return setting(run) != 0


def bundle_summary(bundle) -> dict:
    m = bundle.manifest

    def side(name: str) -> dict:
        info = m.get(name, {})
        keys = ("arch", "vocab_size", "params", "graph_params", "params_pruned", "bytes_per_forward", "dtype",
                "quantization", "kept")
        return {k: info.get(k) for k in keys if k in info} | {"source": (info.get("source") or {}).get("name")}

    v = m.get("vocab", {})
    return {"path": str(bundle.path), "pair": m.get("pair"), "manifest_sha256": manifest_sha256(bundle.path),
            "edgespec_version": m.get("edgespec_version"), "same_tokenizer": bundle.same_tokenizer,
            "kept": bundle.kept, "target": side("target"), "drafter": side("drafter"),
            "vocab": {"policy": (v.get("provenance") or {}).get("policy"), "intersection": v.get("intersection"),
                      "prior": bool(v.get("prior")), "affinity": bool(v.get("affinity")),
                      "randomised": bool(v.get("randomised"))},
            "c_params": M.c_params(m), "c_bytes": M.c_bytes(m)}


def build_report(settings, bundle, runs, records, bandwidth, partial, used, skipped, elapsed_s) -> dict:
    machine = machine_info()
    machine["stream_read_gbs"] = bandwidth["gbs"] if bandwidth else None
    machine["bandwidth_test"] = bandwidth
    sett = settings_dict(settings)
    sett.update({"configurations": [list(k) for k in settings.configs()], "prompts_used": used,
                 "prompts_skipped": skipped})
    return {
        "format": FORMAT, "schema_version": SCHEMA_VERSION, "partial": bool(partial),
        "created_utc": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "elapsed_s": round(float(elapsed_s), 3),
        "machine": machine, "versions": versions(), "bundle": bundle_summary(bundle), "settings": sett,
        "runs": runs,
        "generations": [{k: r.get(k) for k in GENERATION_FIELDS} for r in records],
    }


# --------------------------------------------------------------------------- writing

def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def write_report(doc: dict, out: Path, progress: bool = True) -> dict:
    """Write report.json, report.md and the plots into `out`; returns {name: path}."""
    out = Path(out)
    paths = {"json": out / "report.json", "md": out / "report.md"}
    doc["plots"] = plot_report(doc, out)
    _atomic_write(paths["json"], json.dumps(doc, indent=1, ensure_ascii=False, allow_nan=False) + "\n")
    _atomic_write(paths["md"], markdown(doc))
    if progress:
        print(f"edgespec: wrote {paths['json']} and {paths['md']}" +
              (f" (+ {', '.join(doc['plots'])})" if doc["plots"] else ""), file=sys.stderr)
    return paths


def _fmt(v, spec: str = ".3f") -> str:
    if v is None:
        return "-"
    if isinstance(v, (int, float)):
        return format(v, spec)
    return str(v)


def table(doc: dict) -> str:
    """The key-results table (markdown)."""
    head = ("| strategy | γ | acceptance | τ | decode tok/s | decode speedup | tok/s (e2e) | e2e speedup | TTFT ms "
            "| TTFT ratio | drafter prefill ms | TPOT ms | c_params | c_bytes | c_time "
            "| MBSU params | MBSU bytes | MBSU time | realisation | GB/s | of stream |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in doc["runs"]:
        lines.append("| " + " | ".join([
            r["strategy"], gamma_text(r), _fmt(r["acceptance_rate"]), _fmt(r["tau"], ".2f"),
            _fmt(r.get("decode_tokens_per_s"), ".2f"), _fmt(r.get("decode_speedup"), ".2f"),
            _fmt(r["tokens_per_s"], ".2f"), _fmt(r["speedup"], ".2f"), _fmt(r["ttft_ms"], ".0f"),
            _fmt(r.get("ttft_ratio"), ".2f"), _fmt(r.get("draft_prefill_ms"), ".0f"),
            _fmt(r["tpot_ms"], ".1f"), _fmt(r["c_params"]), _fmt(r["c_bytes"]), _fmt(r["c_time"]),
            _fmt(r["mbsu_params"], ".2f"), _fmt(r["mbsu_bytes"], ".2f"), _fmt(r["mbsu_time"], ".2f"),
            _fmt(r["realisation"], ".2f"), _fmt(r["bandwidth_gbs"], ".2f"), _fmt(r["bandwidth_fraction"], ".2f"),
        ]) + " |")
    return "\n".join(lines)


def _breakdown_table(doc: dict) -> str:
    head = ("| strategy | γ | prefill ms/tok | draft ms/tok | verify ms/tok | overhead ms/tok | overhead share "
            "| sampler / draft | draft step ms | target decode ms | speedup [min, max] | peak RSS MB | resyncs |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in doc["runs"]:
        sp = r["spread"].get("speedup") or [None, None]
        lines.append("| " + " | ".join([
            r["strategy"], gamma_text(r), _fmt(r["prefill_ms_per_token"], ".1f"),
            _fmt(r["draft_ms_per_token"], ".1f"), _fmt(r["verify_ms_per_token"], ".1f"),
            _fmt(r["overhead_ms_per_token"], ".2f"), _fmt(r["overhead_share"]),
            _fmt(r.get("sampler_share"), ".4f"), _fmt(r["draft_step_ms"], ".2f"), _fmt(r["target_decode_ms"], ".2f"), f"[{_fmt(sp[0], '.2f')}, {_fmt(sp[1], '.2f')}]",
            _fmt(r["peak_rss_mb"], ".0f"), str(r["drafter_resyncs"]),
        ]) + " |")
    return "\n".join(lines)


def _category_table(doc: dict) -> str:
    cats = sorted({c for r in doc["runs"] for c in r["by_category"]})
    runs = [r for r in doc["runs"] if drafts(r)]
    if not cats or not runs:
        return ""
    head = "| strategy | γ | " + " | ".join(cats) + " |"
    lines = [head, "|" + "---|" * (len(cats) + 2)]
    for r in runs:
        vals = [_fmt((r["by_category"].get(c) or {}).get("acceptance_rate")) for c in cats]
        lines.append(f"| {r['strategy']} | {gamma_text(r)} | " + " | ".join(vals) + " |")
    return "\n".join(lines)


def _positions(values: list | None) -> str:
    shown = [_fmt(v, ".2f") for v in (values or [])[:8]]
    return " ".join(shown) + (" …" if len(values or []) > 8 else "") if shown else "-"


def _drafting_table(doc: dict) -> str:
    """Per drafting row, pooled over its generations: gamma chosen, zero-accept rounds, fallback time and
    acceptance by draft position (onnxruntime-genai's statistics)."""
    runs = [r for r in doc["runs"] if drafts(r)]
    if not runs:
        return ""
    head = ("| strategy | γ | mean γ | γ chosen (rounds) | zero-accept share | fallback share "
            "| acceptance by position 1, 2, … |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in runs:
        hist = r.get("gamma_histogram") or {}
        lines.append("| " + " | ".join([
            r["strategy"], gamma_text(r), _fmt(r.get("mean_gamma"), ".2f"),
            " ".join(f"{g}:{n}" for g, n in hist.items()) or "-", _fmt(r.get("zero_accept_share")),
            _fmt(r.get("fallback_share")), _positions(r.get("acceptance_by_position")),
        ]) + " |")
    return "\n".join(lines)


def _rejection_sampled(run: dict, settings: dict) -> bool:
    """Whether a sampled row ran rejection sampling (no seed, or coupled_sampling off), not the race."""
    label = run["strategy"].lower().replace(" ", "")
    off = "coupled_sampling=false" in label or settings.get("options", {}).get("coupled_sampling") is False
    return settings.get("seed") is None or off


def lossless_line(doc: dict) -> str:
    """Greedy benches double as a lossless check: every strategy's output must equal ar's; so do seeded
    sampled ones, whose rows sample by the race (runtime/samplers/coupled.py) unless a row turns it off."""
    s = doc["settings"]
    sampled = s["temperature"] != 0
    runs = [r for r in doc["runs"] if drafts(r) and not (sampled and _rejection_sampled(r, s))]
    if not runs:
        return "Sampling: outputs are not compared with ar (rejection sampling; the distribution tests cover it)."
    bad = [f"{r['strategy']} γ={gamma_text(r)}: {r['outputs_differing_from_ar']}" for r in runs
           if r.get("outputs_differing_from_ar")]
    n = sum(r["prompts"] * r["repeats_measured"] for r in runs)
    if sampled:
        return ("**SEEDED CHECK FAILED**: seeded outputs differing from ar's: " + "; ".join(bad) if bad else
                f"Seeded sampled outputs identical to ar's with the same seed in all {n} coupled generations "
                "compared (rows with coupled_sampling=false sample by rejection and are not compared).")
    line = ("**LOSSLESS CHECK FAILED**: greedy outputs differing from ar: " + "; ".join(bad) if bad else
            f"Greedy outputs identical to ar, token for token, in all {n} generations compared.")
    plain = [r for r in doc["runs"] if not drafts(r) and r["strategy"] != "ar"]
    for r in plain:    # ar-fast and peers: the same graph on the 1-token path (not a lossless claim)
        m = r["prompts"] * r["repeats_measured"]
        line += (f" {r['strategy']}: {m - (r.get('outputs_differing_from_ar') or 0)} of {m} outputs identical to "
                 f"{r.get('compared_with', 'ar')}'s.")
    return line


def markdown(doc: dict) -> str:
    s, b, m = doc["settings"], doc["bundle"], doc["machine"]
    providers = sorted({f"{role}: {', '.join(p)}" for r in doc["runs"] for role, p in r["providers"].items()})
    parts = [
        "# edgespec bench report" + (" (PARTIAL: interrupted)" if doc["partial"] else ""), "",
        f"- bundle: `{b['path']}` (pair {b['pair']}, K = {b['kept']}, manifest sha256 {b['manifest_sha256'][:16]}…)",
        f"- prompts: {s['prompts']} split {s['split']}, {len(s['prompts_used'])} prompt(s) × {s['repeats']} repeat(s), "
        f"max_new_tokens {s['max_new_tokens']}, temperature {s['temperature']}",
        f"- EP: {s['ep']}" + (f", drafter EP {s['draft_ep']}" if s.get("draft_ep") else "") +
        f"; providers used: {'; '.join(providers) or '-'}",
        f"- machine: {m['cpu']}, {m['cores']} cores; stream read bandwidth {_fmt(m['stream_read_gbs'], '.2f')} GB/s",
        f"- command: `{s.get('command') or '-'}`", "",
        "Medians over repeats, on the same prompts. Baseline = the fastest plain decoding of this graph: "
        "ar-fast (1-token steps) where measured, else ar. decode speedup = decode rate (tokens after the first ÷ "
        "time after TTFT; a drafter's prefill counts here) ÷ the baseline's; e2e speedup = tokens ÷ total time "
        "(prefill included) ÷ the baseline's; TTFT ratio = TTFT ÷ the baseline's. "
        "MBSU = τ/(c·γ+1) (γ auto: the mean γ chosen; ngram: c = 0); realisation = speedup ÷ MBSU(c_time); "
        "GB/s = weight bytes read per token × tok/s.", "",
        table(doc), "", lossless_line(doc), "", "## Where the time goes", "", _breakdown_table(doc), "",
    ]
    drafting = _drafting_table(doc)
    if drafting:
        parts += ["## Drafting statistics", "", "Pooled over each row's generations. Acceptance at position j = "
                  "rounds accepting ≥ j drafts ÷ rounds that drafted ≥ j and accepted ≥ j−1; zero-accept share = "
                  "drafting rounds that kept no draft; fallback share = time in rounds run with γ = 0 ÷ decode time.",
                  "", drafting, ""]
    cat = _category_table(doc)
    if cat:
        parts += ["## Acceptance by category", "", cat, ""]
    if doc.get("plots"):
        parts += ["## Plots", ""] + [f"![{p}]({p})" for p in doc["plots"]] + [""]
    return "\n".join(parts)


# --------------------------------------------------------------------------- plots

def plot_report(doc: dict, out: Path) -> list[str]:
    """PNG plots (file names relative to `out`); none when matplotlib is missing or nothing drafted."""
    try:  # lazy: the optional [bench] extra
        import matplotlib  # lazy: matplotlib is optional (plots only)
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # lazy: matplotlib is optional (plots only)
    except ImportError:
        print("edgespec: warning: matplotlib is not installed (pip install 'edgespec[bench]'): no plots",
              file=sys.stderr)
        return []
    runs = [r for r in doc["runs"] if drafts(r)]
    if not runs:
        return []
    names = [_plot_speedup(plt, runs, out)]
    if any(r["by_category"] for r in runs):
        names.append(_plot_categories(plt, runs, out))
    return names


def _plot_speedup(plt, runs: list[dict], out: Path) -> str:
    from matplotlib.ticker import MaxNLocator  # lazy: matplotlib is optional (plots only)

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    curves = (("mbsu_time", "o-", "c_time"), ("mbsu_bytes", "s--", "c_bytes"), ("mbsu_params", "^:", "c_params"))
    for strategy in dict.fromkeys(r["strategy"] for r in runs):
        rs = sorted((r for r in runs if r["strategy"] == strategy), key=lambda r: gamma_order(setting(r)))
        fixed = [r for r in rs if not is_auto(setting(r))]
        auto = [r for r in rs if is_auto(setting(r)) and r["draft_length"] is not None]
        g = [r["draft_length"] for r in fixed]
        line, = ax1.plot(g, [r["speedup"] for r in fixed], "o-", label=strategy if fixed else "_nolegend_")
        color = line.get_color()
        for key, style, lab in curves:
            ys = [r[key] for r in fixed]
            if any(y is not None for y in ys):
                ax2.plot(g, [float("nan") if y is None else y for y in ys], style, color=color,
                         label=f"{strategy} ({lab})")
        for r in auto:            # γ auto: one star at the mean γ chosen
            ax1.plot([r["draft_length"]], [r["speedup"]], "*", ms=12, color=color, label=f"{strategy} γ=auto")
            ax1.annotate("auto", (r["draft_length"], r["speedup"] or 0.0), textcoords="offset points", xytext=(5, 5),
                         fontsize=7)
            if r["mbsu_time"] is not None:
                ax2.plot([r["draft_length"]], [r["mbsu_time"]], "*", ms=12, color=color,
                         label=f"{strategy} γ=auto (c_time)")
    for ax, title in ((ax1, "measured speedup over ar"), (ax2, "MBSU = τ/(cγ+1)")):
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_xlabel("draft length γ (auto: mean γ chosen)")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / PLOT_SPEEDUP, dpi=110)
    plt.close(fig)
    return PLOT_SPEEDUP


def _plot_categories(plt, runs: list[dict], out: Path) -> str:
    cats = sorted({c for r in runs for c in r["by_category"]})
    fig, ax = plt.subplots(figsize=(max(5.0, 1.2 * len(cats) * max(1, len(runs)) / 3), 4))
    width = 0.8 / len(runs)
    for i, r in enumerate(runs):
        vals = [(r["by_category"].get(c) or {}).get("acceptance_rate") for c in cats]
        xs = [j + i * width for j in range(len(cats))]
        ax.bar(xs, [0.0 if v is None else v for v in vals], width, label=f"{r['strategy']} γ={gamma_text(r)}")
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(cats))], cats, rotation=20)
    ax.set_ylabel("acceptance rate")
    ax.set_ylim(0, 1)
    ax.set_title("acceptance per category")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(out / PLOT_CATEGORY, dpi=110)
    plt.close(fig)
    return PLOT_CATEGORY
