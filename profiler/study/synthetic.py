"""`edgespec study synthetic`: the RDK paper's Fig. 7 (§6.2) on synthetic targets, no models.

Setting (docs/study-synthetic.md has the choices the paper leaves open, and the results):
- Positions are independent. At each one the target's logits over V tokens (default 200,000) are i.i.d.
  Student t: z = scale * t_df (df = 5, the paper's Fig. 3 fit; the scale is not printed: 0.75 makes the
  median top-25 % mass of p 95.8 %, the figure Fig. 5 quotes), p = softmax(z).
- The drafter: the paper plots only the target and its pruned versions (Fig. 6), so q = p by default;
  --noise s gives a perturbed drafter q = softmax(z + s N(0, 1)) (the logit noise of Theorem 5.2).
- Pruning keeps the drafter's K most frequent tokens (FR-Spec, §3): columns ranked by summed q over
  --calib-positions calibration positions, which also give the prior of rdk-taylor and the calibrated M.
- alpha = sum_x min(p(x), d(x)) per held-out position for each draft law d (Def. 2.1), mean and
  standard error std/sqrt(n) per (sampler, K), and the paired difference to TLI with its SE.
Samplers: masked, tli, rdk-taylor (Eq. 3 on TLI with the calibrated prior, as the runtime) and rdk M=cooc
(Algorithm 1 with calibrate's co-occurrence M) come from profiler/study/samplers.py `level_alphas`, the
acceptance study's own code; added here: rdk-taylor-oracle (Eq. 3 with p = this position's target, the p
of Theorem 5.4) and rdk M=eq2 (Algorithm 1 with Eq. 2's M built from this target's exact logit covariance,
Omega = Var(z) I, dense, in closed form: `eq2_rdk`). The union baseline equals TLI here (D = T): left out.
"""
from __future__ import annotations

import csv
import json
import math
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
from tqdm import tqdm

from edgespec.calibrate.priors import make_estimator
from edgespec.profiler.errors import StudyError
from edgespec.profiler.study.samplers import attach_samplers, level_alphas, make_level, overlap, taylor_samplers
from edgespec.runtime.samplers.rdk import DEFAULT_TOL, RdkTaylor
from edgespec.runtime.samplers.sampling import softmax
from edgespec.runtime.samplers.tli import tli_rows

PAPER_ALPHA = 0.267             # §6.2 / Fig. 7: RDK's "almost constant" acceptance down to 500 of 200k
DEFAULT_KEPT = [500, 1_000, 2_000, 5_000, 10_000, 20_000, 50_000, 100_000, 200_000]
DEFAULT_SCALE = 0.75
SYNTHETIC_ESTIMATORS = ("cooc", "cov")          # calibrate/priors.py estimators that need no tokenizers
COV_TAU = 0.1                   # the acceptance study's default relative tau for M = cov
CHUNK = 16
SAMPLERS = ("masked", "tli", "rdk-taylor", "rdk-taylor-oracle", "rdk")     # row order
CSV_FIELDS = ("sampler", "beta", "estimator", "label", "kept", "kept_fraction", "alpha", "alpha_se",
              "delta_vs_tli", "delta_vs_tli_se", "positions")


@dataclass
class SyntheticConfig:
    out: Path
    vocab: int = 200_000
    kept: list[int] = field(default_factory=lambda: list(DEFAULT_KEPT))
    positions: int = 1000
    calib_positions: int = 200
    df: float = 5.0
    scale: float = DEFAULT_SCALE
    noise: float = 0.0
    betas: list[float] = field(default_factory=lambda: [1.0])
    estimators: list[str] = field(default_factory=lambda: ["cooc"])
    affinity_topk: int = 32
    tau: float = 1.0            # Eq. 2's temperature for M = eq2
    seed: int = 0
    progress: bool = True
    command: str = ""


def check_config(cfg: SyntheticConfig) -> None:
    bad = [f"{name} {value!r}" for name, value, ok in (
        ("--vocab", cfg.vocab, cfg.vocab >= 2), ("--positions", cfg.positions, cfg.positions >= 2),
        ("--calib-positions", cfg.calib_positions, cfg.calib_positions >= 1), ("--df", cfg.df, cfg.df > 0),
        ("--scale", cfg.scale, cfg.scale > 0), ("--noise", cfg.noise, cfg.noise >= 0), ("--tau", cfg.tau, cfg.tau > 0),
        ("--kept", cfg.kept, bool(cfg.kept) and all(k == int(k) and 1 <= k <= cfg.vocab for k in cfg.kept)),
        ("--betas", cfg.betas, all(math.isfinite(b) and b >= 0 for b in cfg.betas)),
        ("--estimators", cfg.estimators, set(cfg.estimators) <= set(SYNTHETIC_ESTIMATORS))) if not ok]
    if bad:
        raise StudyError("synthetic study: bad " + "; ".join(bad) + f" (kept sizes must be integers in 1..--vocab, "
                         f"estimators among {', '.join(SYNTHETIC_ESTIMATORS)})")


def synthetic_chunks(cfg: SyntheticConfig, rng: np.random.Generator, n: int):
    """(p, q) float64 [s, V] chunks of n positions: p = softmax(scale t_df), q = p or its noisy drafter."""
    for start in range(0, n, CHUNK):
        z = cfg.scale * rng.standard_t(cfg.df, size=(min(CHUNK, n - start), cfg.vocab))
        p = softmax(z, dtype=np.float64)
        q = p if cfg.noise == 0 else softmax(z + cfg.noise * rng.standard_normal(z.shape), dtype=np.float64)
        yield p, q


def logit_variance(cfg: SyntheticConfig) -> float:
    """Var(z_i) = scale^2 df / (df - 2): the diagonal of the target's logit covariance (inf for df <= 2)."""
    return cfg.scale ** 2 * cfg.df / (cfg.df - 2) if cfg.df > 2 else math.inf


def eq2_rdk(q_tli: np.ndarray, variance: float, tau: float) -> np.ndarray:
    """Algorithm 1, p' = M^T q', with Eq. 2's M on Omega = variance * I (i.i.d. logits): for every row i,
    M_ij = (e^c [i = j] + [i != j]) / (e^c + N - 1), c = variance / tau, N = |T|, so
    p' = ((e^c - 1) q' + 1) / (e^c + N - 1) in O(N), without the dense N x N matrix. Rows of q' sum to 1."""
    n = q_tli.shape[-1]
    c = variance / tau
    if c > 700:                 # e^c overflows: M = I to float precision, RDK is TLI
        return q_tli.copy()
    ec = math.exp(c)
    return ((ec - 1.0) * q_tli + 1.0) / (ec + n - 1.0)


@dataclass
class Calibration:
    ranking: np.ndarray         # token ids, most frequent (summed q) first
    prior: np.ndarray           # mean target distribution: rdk-taylor's p (the runtime's unigram prior)
    affinities: dict            # estimator -> CSR over all V rows
    info: dict


def calibrate(cfg: SyntheticConfig, rng: np.random.Generator) -> Calibration:
    ids = np.arange(cfg.vocab, dtype=np.int64)            # drafter token i is target token i (D = T)
    estimators = {e: make_estimator(e, ids, cfg.vocab) for e in cfg.estimators}
    q_mass, p_mass = np.zeros(cfg.vocab), np.zeros(cfg.vocab)
    for p, q in synthetic_chunks(cfg, rng, cfg.calib_positions):
        q_mass += q.sum(axis=0)
        p_mass += p.sum(axis=0)
        for est in estimators.values():
            est.add(p, q)                                 # TLI over all V columns is q itself
    affinities, info = {}, {}
    for name, est in estimators.items():
        csr, info[name] = est.build(cfg.affinity_topk, tau=COV_TAU)
        affinities[name] = tuple(np.asarray(a, dtype=t) for a, t in zip(csr, (np.float64, np.int64, np.int64)))
    return Calibration(np.argsort(-q_mass, kind="stable"), p_mass / p_mass.sum(), affinities, info)


def chunk_alphas(p: np.ndarray, q: np.ndarray, level, cfg: SyntheticConfig) -> dict:
    """{(sampler, beta or estimator): alpha per row} at one kept level."""
    out = {k: a for k, a in level_alphas(p, q, level, DEFAULT_TOL).items() if k[0] != "union"}
    tli = tli_rows(q[:, level.valid_cols], level.target_ids, probs=True, dtype=np.float64, n_target=cfg.vocab)
    for beta in cfg.betas:
        d = np.stack([RdkTaylor(p[i], beta)(tli[i]) for i in range(p.shape[0])])
        out[("rdk-taylor-oracle", float(beta))] = overlap(p, d)
    if cfg.df > 2:
        out[("rdk", "eq2")] = overlap(p, eq2_rdk(tli, logit_variance(cfg), cfg.tau))
    return out


def label(key: tuple, cfg: SyntheticConfig) -> str:
    name, arg = key
    if name.startswith("rdk-taylor"):
        return f"rdk-taylor β={arg:g} (p = {'target' if name.endswith('oracle') else 'prior'})"
    if name == "rdk":
        return f"rdk M=eq2 τ={cfg.tau:g}" if arg == "eq2" else f"rdk M={arg}"
    return "TLI" if name == "tli" else name


def summarise(samples: dict, cfg: SyntheticConfig) -> list[dict]:
    rows = []
    for (key, kept), parts in samples.items():
        a = np.concatenate(parts)
        diff = a - np.concatenate(samples[(("tli", None), kept)])
        rows.append({"sampler": key[0], "beta": key[1] if key[0].startswith("rdk-taylor") else None,
                     "estimator": key[1] if key[0] == "rdk" else None, "label": label(key, cfg), "kept": kept,
                     "kept_fraction": kept / cfg.vocab, "alpha": float(a.mean()), "alpha_se": se(a),
                     "delta_vs_tli": float(diff.mean()), "delta_vs_tli_se": se(diff), "positions": int(a.size)})
    return sorted(rows, key=lambda r: (SAMPLERS.index(r["sampler"]), r["beta"] or 0, str(r["estimator"]), r["kept"]))


def se(a: np.ndarray) -> float:
    return float(a.std() / math.sqrt(a.size))


def run_synthetic(cfg: SyntheticConfig) -> dict:
    check_config(cfg)
    t0 = time.time()
    calib_rng, held_rng = (np.random.default_rng(s) for s in np.random.SeedSequence(cfg.seed).spawn(2))
    cal = calibrate(cfg, calib_rng)
    taylor = taylor_samplers(cal.prior, cfg.betas)
    ids = np.arange(cfg.vocab, dtype=np.int64)
    levels = []
    for k in sorted({int(k) for k in cfg.kept}):
        level = make_level(100.0 * k / cfg.vocab, cal.ranking, ids)
        attach_samplers(level, taylor, cal.affinities, cfg.vocab)
        levels.append(level)
    samples: dict = {}
    target = {"uniform_alpha": [], "top25_mass": [], "max_prob": [], "unpruned_alpha": []}
    quarter = cfg.vocab - max(1, cfg.vocab // 4)
    with tqdm(total=cfg.positions, desc="synthetic positions", unit="pos", disable=not cfg.progress) as bar:
        for p, q in synthetic_chunks(cfg, held_rng, cfg.positions):
            target["uniform_alpha"].append(overlap(p, np.full_like(p, 1.0 / cfg.vocab)))
            target["top25_mass"].append(np.partition(p, quarter, axis=1)[:, quarter:].sum(axis=1))
            target["max_prob"].append(p.max(axis=1))
            target["unpruned_alpha"].append(overlap(p, q))
            for level in levels:
                for key, a in chunk_alphas(p, q, level, cfg).items():
                    samples.setdefault((key, level.kept), []).append(a)
            bar.update(p.shape[0])
    stats = {name: np.concatenate(v) for name, v in target.items()}
    doc = {"format": "edgespec-synthetic-study", "schema_version": 1,
           "settings": {**asdict(cfg), "out": str(cfg.out)},
           "paper": {"figure": "RDK paper Fig. 7 (§6.2)", "rdk_alpha": PAPER_ALPHA},
           "target": {"logit_variance": logit_variance(cfg),
                      "eq2_identity_weight": eq2_identity_weight(cfg),
                      **{f"{name}_{f}": float(fn(v)) for name, v in stats.items()
                         for f, fn in (("mean", np.mean), ("median", np.median))},
                      "uniform_alpha_se": se(stats["uniform_alpha"])},
           "calibration": {"positions": cfg.calib_positions, "affinity": cal.info},
           "positions": cfg.positions, "rows": summarise(samples, cfg)}
    doc["elapsed_s"] = round(time.time() - t0, 1)
    write(doc, Path(cfg.out))
    return doc


def eq2_identity_weight(cfg: SyntheticConfig) -> float | None:
    """lambda in p' = lambda q' + (1 - lambda) uniform for M = eq2 (0: RDK is the uniform law; 1: TLI)."""
    if cfg.df <= 2:
        return None
    c = logit_variance(cfg) / cfg.tau
    return 1.0 if c > 700 else (math.exp(c) - 1.0) / (math.exp(c) + cfg.vocab - 1.0)


# --------------------------------------------------------------------------- outputs

def write(doc: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    doc["plots"] = plot(doc, out / "synthetic.png")
    (out / "synthetic.json").write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    with open(out / "synthetic.csv", "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=CSV_FIELDS, extrasaction="ignore")
        w.writeheader()
        w.writerows(doc["rows"])


def _pyplot():
    """matplotlib.pyplot on the Agg backend, None without matplotlib (optional: edgespec[bench])."""
    try:                        # lazy: slow to import, and only the plot needs it
        import matplotlib  # lazy: matplotlib is optional (plots only)
    except ImportError:
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot  # lazy: matplotlib is optional (plots only)
    return matplotlib.pyplot


def plot(doc: dict, path: Path) -> list[str]:
    plt = _pyplot()
    if plt is None:
        print("edgespec: warning: matplotlib is not installed: no plot", file=sys.stderr)
        return []
    fig, ax = plt.subplots(figsize=(7.5, 4.6))
    for i, lab in enumerate(dict.fromkeys(r["label"] for r in doc["rows"])):
        rs = [r for r in doc["rows"] if r["label"] == lab]      # lines that coincide stay visible: own dashes
        ax.errorbar([r["kept"] for r in rs], [r["alpha"] for r in rs], yerr=[r["alpha_se"] for r in rs],
                    marker="oxv^sD*P"[i % 8], ms=4, lw=1.3, capsize=2, ls=("-", "--", ":", "-.")[i % 4], label=lab)
    ax.axhline(PAPER_ALPHA, color="black", ls=(0, (6, 3)), lw=1, label=f"paper, RDK: {PAPER_ALPHA:.1%} (Fig. 7)")
    s = doc["settings"]
    ax.set_xscale("log")
    ax.set_xlabel(f"kept drafter tokens K (of V = {s['vocab']:,})")
    ax.set_ylabel("acceptance α = E Σ min(p, d)")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title(f"synthetic Student-t targets (df={s['df']:g}, scale={s['scale']:g}, noise={s['noise']:g}), "
                 f"{doc['positions']} positions", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [path.name]


def table(doc: dict) -> str:
    """Markdown: one line per kept size K, one column per sampler, alpha ± SE in %."""
    labels = list(dict.fromkeys(r["label"] for r in doc["rows"]))
    cell = {(r["label"], r["kept"]): r for r in doc["rows"]}
    lines = ["| K | " + " | ".join(labels) + " |", "|---:|" + "---:|" * len(labels)]
    for k in sorted({r["kept"] for r in doc["rows"]}):
        lines.append(f"| {k:,} | " + " | ".join(f"{100 * cell[(lab, k)]['alpha']:.2f} ± {100 * cell[(lab, k)]['alpha_se']:.2f}"
                                               for lab in labels) + " |")
    return "\n".join(lines)
