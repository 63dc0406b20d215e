"""Outputs of `edgespec study acceptance`: study.json, acceptance.csv and the plots."""
from __future__ import annotations

import csv
import json
import os
import sys
from dataclasses import asdict
from pathlib import Path

CSV_FIELDS = ("sampler", "beta", "estimator", "kept_percent", "kept", "pruned_fraction", "alpha", "alpha_se",
              "delta_vs_tli", "delta_vs_tli_se", "positions", "tau", "c_params", "mbsu_params")


def settings(cfg) -> dict:
    d = asdict(cfg)
    for k in ("out", "bundle", "export_cache"):
        d[k] = None if d[k] is None else str(d[k])
    return d


def _label(r: dict) -> str:
    if r["sampler"] == "rdk-taylor":
        return f"rdk-taylor β={r['beta']:g}"
    if r["sampler"] == "rdk":
        return f"rdk M={r['estimator']}"
    if r["sampler"] == "slrs-bound":
        return "SLRS upper bound (any lookahead)"
    return r["sampler"]


def write(doc: dict, out: Path) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / "study.json", "csv": out / "acceptance.csv"}
    doc["plots"] = plots(doc, out)
    tmp = paths["json"].with_suffix(".json.tmp")
    tmp.write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(tmp, paths["json"])
    with open(paths["csv"], "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=CSV_FIELDS, extrasaction="ignore")
        w.writeheader()
        for r in doc["rows"]:
            w.writerow(r)
    if doc["settings"].get("progress", True):
        print(f"edgespec: wrote {paths['csv']}, {paths['json']}" +
              (f" (+ {', '.join(doc['plots'])})" if doc["plots"] else ""), file=sys.stderr)
    return paths


def table(doc: dict) -> str:
    """alpha ± its standard error per sampler (rows) and kept percentage (columns), markdown."""
    pcts = sorted({r["kept_percent"] for r in doc["rows"]})
    labels = list(dict.fromkeys(_label(r) for r in doc["rows"]))
    cell = {(_label(r), r["kept_percent"]): r for r in doc["rows"]}
    lines = ["| sampler | " + " | ".join(f"K={p:g}%" for p in pcts) + " |", "|---|" + "---|" * len(pcts)]
    for lab in labels:
        vals = [cell.get((lab, p)) for p in pcts]
        lines.append(f"| {lab} | " + " | ".join("-" if r is None else f"{r['alpha']:.3f} ± {r['alpha_se']:.3f}"
                                                for r in vals) + " |")
    return "\n".join(lines)


def plots(doc: dict, out: Path) -> list[str]:
    try:                        # lazy: matplotlib is optional (edgespec[bench]) and slow to import
        import matplotlib  # lazy: matplotlib is optional (plots only)
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # lazy: matplotlib is optional (plots only)
    except ImportError:
        print("edgespec: warning: matplotlib is not installed: no plots", file=sys.stderr)
        return []
    names = [_alpha_plot(plt, doc, out)]
    if any(r.get("mbsu_params") is not None for r in doc["rows"]):
        names.append(_vocabtrim_plot(plt, doc, out))
    return names


def _style(r: dict, shade: float) -> dict:
    if r["sampler"] == "masked":
        return {"color": "grey", "ls": ":", "marker": "x"}
    if r["sampler"] == "tli":
        return {"color": "black", "ls": "-", "marker": "o"}
    if r["sampler"] == "union":
        return {"color": "grey", "ls": "--", "marker": "v"}
    if r["sampler"] == "slrs-bound":
        return {"color": "tab:red", "ls": ":", "marker": "*"}
    if r["sampler"] == "rdk":
        colors = {"cooc": "tab:blue", "cov": "tab:green", "prefix": "tab:purple", "first": "tab:brown"}
        return {"color": colors.get(r["estimator"], "tab:cyan"), "ls": "-", "marker": "s"}
    import matplotlib.cm as cm  # lazy: optional, as in plots()

    return {"color": cm.autumn(shade), "ls": "-" if r["beta"] == 1 else "--", "marker": "^"}


def _alpha_plot(plt, doc: dict, out: Path) -> str:
    fig, ax = plt.subplots(figsize=(7.5, 4.6))
    labels = list(dict.fromkeys(_label(r) for r in doc["rows"]))
    betas = sorted({r["beta"] for r in doc["rows"] if r["beta"] is not None})
    for lab in labels:
        rs = sorted((r for r in doc["rows"] if _label(r) == lab), key=lambda r: r["pruned_fraction"])
        shade = betas.index(rs[0]["beta"]) / max(len(betas), 1) if rs[0]["beta"] is not None else 0.0
        ax.plot([r["pruned_fraction"] for r in rs], [r["alpha"] for r in rs], label=lab, lw=1.4,
                **_style(rs[0], shade))
    m = doc["models"]
    ax.set_xlabel(f"fraction of the drafter vocabulary pruned (V_d = {m['drafter_vocab']})")
    ax.set_ylabel("expected acceptance α = Σ min(p, q)")
    ax.set_title(f"acceptance recovery, {m.get('pair') or 'pair'}, {doc['heldout_positions']} held-out positions")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(out / "acceptance.png", dpi=110)
    plt.close(fig)
    return "acceptance.png"


def _vocabtrim_plot(plt, doc: dict, out: Path) -> str:
    rs = sorted((r for r in doc["rows"] if r["sampler"] == "tli"), key=lambda r: r["kept"])
    fig, ax1 = plt.subplots(figsize=(6.5, 4.2))
    ks = [r["kept"] for r in rs]
    ax1.plot(ks, [r["tau"] for r in rs], "o-", color="black", label="expected τ")
    ax1.set_xscale("log")
    ax1.set_xlabel("kept drafter tokens K")
    ax1.set_ylabel(f"τ at γ={doc['settings']['gamma']} (i.i.d. α)")
    ax2 = ax1.twinx()
    ax2.plot(ks, [r["mbsu_params"] for r in rs], "s--", color="tab:orange", label="MBSU (c_params)")
    ax2.set_ylabel("MBSU = τ/(c_params γ + 1)")
    ax1.set_title("VocabTrim view (TLI)")
    fig.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "vocabtrim.png", dpi=110)
    plt.close(fig)
    return "vocabtrim.png"
