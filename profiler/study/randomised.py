"""`edgespec study randomised`: measured acceptance of randomised drafting against Lemma 4.1, and the
tokens-per-second curve against the drafting probability a (docs/study-randomised.md).

Per prompt, interleaved, one seed: `ar`, then `tli` with draft_probability=a for every a (T > 0, the
decoder's own code path). Then, teacher-forced through the SAME sessions (the decoder's runners):
- every `ar` output (a sample of the target's law, like every lossless output) gives p (target) and q
  (the runtime's TLI law over the pruned drafter: the strategy's `distribution`) at each generated
  position j >= 1 (position 0 comes from the prefill and is never drafted), and
  alpha_j(a) = runtime.randomised.acceptance_rate(p, q, a) = (1 + a - ||p - a q||_1) / (2a) (Lemma 4.1);
- every `tli` output gives alpha_j(a) on its own trajectory ("on-run").

Accounting (stats.py): the runtime's `acceptance_rate` is accepted / drafted, and `drafted` counts
every draft of a round, also those after the first rejection, which are never verified. Lemma 4.1 is
P(accept | a token was drafted at a position that is verified). Per round with d drafts and n accepted,
the verified drafts are min(d, n + 1): the `verified` acceptance = sum n / sum min(d, n + 1).
Predictions, for each a:
- uniform: mean_j alpha_j over the ar positions: Lemma 4.1 averaged as if every position were
  equally likely to be drafted;
- chain: sum_j w_j alpha_j / sum_j w_j with w_j = P(j is drafted and verified | x_<j), exact from
  the chain rule (runtime/round/randomised.py) by a forward filter over "where the current round started":
  chaining drafts more often after an accepted draft, so this is what the verified rate estimates;
- runtime: sum_j w_j alpha_j / E[drafted], E[drafted] = sum_s P(a round starts at s) sum_{k<=g_s} a^k,
  the prediction of the runtime's own accepted / drafted;
- on-run: sum over the run's verified positions of alpha_j / their count, against its measured
  verified acceptance: the difference is a martingale sum, its SE sqrt(sum alpha (1 - alpha)) / count.
"""
from __future__ import annotations

import csv
import json
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
from tqdm import tqdm

from edgespec.calibrate.prompts import HUMANEVAL, load_prompts
from edgespec.profiler.errors import StudyError
from edgespec.runtime.bundle.bundle import Bundle
from edgespec.runtime.round.context import drafter_context
from edgespec.runtime.api.decoder import SpeculativeDecoder
from edgespec.runtime.round.randomised import acceptance_rate
from edgespec.runtime.samplers.sampling import SamplingParams, probabilities

WINDOW = 64                    # teacher-forced tokens per forward (bounded [WINDOW, V] logits)
WARMUP_TOKENS = 8
CSV_FIELDS = ("a", "prompts", "positions", "drafted", "verified", "accepted", "acceptance_runtime",
              "acceptance_runtime_se", "acceptance_verified", "acceptance_verified_se", "predicted_uniform",
              "predicted_uniform_se", "predicted_chain", "predicted_chain_se", "predicted_runtime",
              "predicted_runtime_se", "chain_minus_uniform", "chain_minus_uniform_se", "on_run_measured",
              "on_run_predicted", "on_run_se", "on_run_z", "decode_tokens_per_s", "speedup")


@dataclass
class RandomisedConfig:
    bundle: Path
    out: Path
    prompts: str = HUMANEVAL
    split: str | None = None             # default: test for humaneval, all for a file
    limit: int = 8
    max_new_tokens: int = 64
    a_values: list[float] = field(default_factory=lambda: [0.25, 0.5, 0.75, 1.0])
    draft_length: int = 4
    temperature: float = 1.0
    seed: int = 0
    threads: int | None = None
    warmup: bool = True
    progress: bool = True
    command: str = ""


def check_config(cfg: RandomisedConfig) -> None:
    if not cfg.a_values or any(not 0.0 < a <= 1.0 for a in cfg.a_values):
        raise StudyError(f"--a needs drafting probabilities in (0, 1], got {cfg.a_values}")
    for name, v in (("--limit", cfg.limit), ("--max-new-tokens", cfg.max_new_tokens),
                    ("--draft-length", cfg.draft_length)):
        if v < 1:
            raise StudyError(f"{name} must be >= 1, got {v}")
    if not cfg.temperature > 0:
        raise StudyError(f"--temperature must be > 0 (randomised drafting only acts when sampling), "
                         f"got {cfg.temperature}")
    try:
        Path(cfg.out).mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise StudyError(f"output directory {cfg.out} is not writable ({exc.strerror or exc})") from None


# --------------------------------------------------------------------------- teacher forcing

def _rows(runner, head: list[int], tail: list[int]) -> np.ndarray:
    """Logits of `tail`'s positions after `head` (the runner's own cache, in windows): [len(tail), V]."""
    runner.reset()
    runner.reserve(len(head) + len(tail) + 1)
    runner.forward(head)
    return np.concatenate([np.array(runner.forward(tail[i:i + WINDOW])) for i in range(0, len(tail), WINDOW)])


def trajectory(dec, prompt_ids: list[int], generated: list[int], params: SamplingParams, a_values) -> dict:
    """p and q at generated positions j = 1..n-1 (the ones a round can draft): per position alpha(a)
    [m, len(a)] (Lemma 4.1, runtime function), sum min(p, q), p(x_j) and q(x_j) of the emitted token."""
    m = len(generated) - 1
    out = {"alpha": np.zeros((m, len(a_values))), "sd": np.zeros(m), "px": np.zeros(m), "qx": np.zeros(m)}
    if m <= 0:
        return out
    ctx = drafter_context(dec.bundle)
    ctx.start(list(prompt_ids))
    head = list(ctx.ids)
    t_rows = _rows(dec.target, list(prompt_ids), generated[:m])
    d_rows = _rows(dec.drafter, head, generated[:m])
    q = np.empty(dec.bundle.target.vocab_size, dtype=np.float64)
    for i in range(m):
        p = probabilities(t_rows[i:i + 1], params)[0]
        dec.strategy.distribution(dec.setup.prepared, d_rows[i], params, q)
        x = generated[i + 1]
        out["alpha"][i] = [acceptance_rate(p, q, a) for a in a_values]
        out["sd"][i], out["px"][i], out["qx"][i] = np.minimum(p, q).sum(), p[x], q[x]
    return out


def chain_weights(px, qx, alpha, a: float, gamma: int, max_new: int) -> tuple[np.ndarray, float]:
    """(w_j = P(position j is drafted and verified | x_<j) for j = 1..n-1, expected drafts) for a
    trajectory with p(x_j) = px, q(x_j) = qx and Lemma 4.1's alpha_j at this a. State: s, the position
    where the current round started; a round starting at s drafts at most g_s = min(gamma, max_new - s - 1)
    (Generation.draft_budget). Expected drafts = sum w + the unverified ones: after a rejection at offset
    k of a round, its coins k+1..g_s were already flipped, sum_{i <= g_s - k} a^i drafts in expectation."""
    m = len(px)
    s_idx = np.arange(m + 2)                 # round starts s = 1..m+1 (index 0 unused)
    start = np.zeros(m + 2)
    start[1] = 1.0
    g = np.clip(np.minimum(gamma, max_new - s_idx - 1), 0, None)
    geo = np.cumsum([0.0] + [a ** i for i in range(1, gamma + 1)])     # geo[r] = sum_{i <= r} a^i
    with np.errstate(divide="ignore", invalid="ignore"):
        kept = np.where(px > 0, np.minimum(a * qx, px) / px, 0.0)   # P(x_j came from an accepted draft)
    w, unverified = np.zeros(m), 0.0
    for i in range(m):
        j = i + 1
        offset = j - s_idx + 1
        active = (s_idx <= j) & (offset <= g)
        live = start * active
        w[i] = a * live.sum()
        unverified += a * (1.0 - alpha[i]) * float(live @ geo[np.clip(g - offset, 0, gamma)])
        new = start.sum() - live.sum() * kept[i]
        start = live * kept[i]
        start[j + 1] = new
    return w, float(w.sum() + unverified)


def verified_positions(stats, n_out: int) -> tuple[np.ndarray, np.ndarray]:
    """(positions j of verified drafts, accepted?) of one run, from its per-round counts; positions
    beyond the returned tokens (drafts accepted after an EOS) are dropped."""
    pos, acc, s = [], [], 1
    for d, n in zip(stats.drafted_per_step, stats.accepted_per_step):
        for k in range(min(d, n + 1)):
            if s + k < n_out:
                pos.append(s + k)
                acc.append(k < n)
        s += n + 1
    return np.asarray(pos, dtype=np.int64), np.asarray(acc, dtype=bool)


# --------------------------------------------------------------------------- measuring

def ratio(num, den) -> tuple[float, float]:
    """sum(num) / sum(den) and its standard error clustered by prompt (delta method; nan below 2)."""
    num, den = np.asarray(num, dtype=np.float64), np.asarray(den, dtype=np.float64)
    if den.sum() <= 0:
        return float("nan"), float("nan")
    r = num.sum() / den.sum()
    n = num.size
    if n < 2:
        return float(r), float("nan")
    return float(r), float(np.sqrt(n / (n - 1) * np.sum((num - r * den) ** 2)) / den.sum())


def difference(x: tuple, y: tuple) -> tuple[float, float]:
    """ratio(*x) - ratio(*y) over the same prompts, with its clustered standard error (paired)."""
    (xn, xd), (yn, yd) = [(np.asarray(n, dtype=np.float64), np.asarray(d, dtype=np.float64)) for n, d in (x, y)]
    rx, ry = ratio(xn, xd)[0], ratio(yn, yd)[0]
    lin = (xn - rx * xd) / xd.sum() - (yn - ry * yd) / yd.sum()
    k = lin.size
    return float(rx - ry), float(np.sqrt(k / (k - 1) * np.sum(lin ** 2))) if k > 1 else float("nan")


def select_prompts(cfg: RandomisedConfig) -> list:
    split = cfg.split or ("test" if cfg.prompts == HUMANEVAL else "all")
    prompts = [p for p in load_prompts(cfg.prompts, split) if p.text.strip()]
    if not prompts:
        raise StudyError(f"no usable prompts in {cfg.prompts} (split {split})")
    return prompts[: cfg.limit]


def make_decoders(cfg: RandomisedConfig, bundle: Bundle) -> dict:
    if not bundle.has_drafter or not bundle.same_tokenizer:
        raise StudyError(f"bundle {bundle.path}: the randomised study needs a same-tokenizer pair (the drafter's "
                         "positions are the target's; a heterogeneous drafter re-tokenises its context)")
    base = SpeculativeDecoder(bundle, strategy="tli", draft_length=cfg.draft_length, threads=cfg.threads,
                              draft_probability=cfg.a_values[0],
                              # Lemma 4.1 is rejection sampling's law: seeded, the race would run instead
                              options={"defer_drafter": False, "coupled_sampling": False})
    decs = {"ar": base.variant("ar")}
    for a in cfg.a_values:
        decs[a] = base if a == cfg.a_values[0] else base.variant("tli", draft_probability=a)
    return decs


def run_randomised(cfg: RandomisedConfig) -> dict:
    t0 = time.time()
    check_config(cfg)
    cfg.a_values = sorted(set(float(a) for a in cfg.a_values))
    prompts = select_prompts(cfg)
    bundle = Bundle.load(cfg.bundle, verify="fast")
    decs = make_decoders(cfg, bundle)
    tli = decs[cfg.a_values[0]]
    params = SamplingParams(temperature=cfg.temperature)
    limit = tli.target.max_position
    encoded = [(p, ids) for p in prompts for ids in [tli.encode_prompt(p.text)]
               if not limit or len(ids) + cfg.max_new_tokens <= limit]
    if not encoded:
        raise StudyError(f"no prompt fits the context {limit} with --max-new-tokens {cfg.max_new_tokens}")
    if cfg.warmup:
        for dec in decs.values():
            dec.generate(encoded[0][1], max_new_tokens=WARMUP_TOKENS, temperature=cfg.temperature, seed=cfg.seed)
    per = {key: [] for key in decs}      # per prompt, per key: one dict of sums
    sd_vals, lemma1 = [], []
    for i, (prompt, ids) in enumerate(tqdm(encoded, desc="randomised", unit="prompt", disable=not cfg.progress,
                                           file=sys.stderr)):
        runs = {key: dec.generate(ids, max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature,
                                  seed=cfg.seed + i) for key, dec in decs.items()}
        for key, res in runs.items():
            st = res.stats
            per[key].append({"prompt_id": prompt.id, "new_tokens": st.new_tokens,
                             "decode_tokens": st.new_tokens - st.prefill_tokens,
                             "decode_s": max(st.total_ms - st.ttft_ms, 0.0) / 1e3,
                             "drafted": st.drafted, "accepted": st.accepted})
        ar_gen = runs["ar"].token_ids
        tf = trajectory(tli, ids, ar_gen, params, cfg.a_values)
        sd_vals.append(tf["sd"])
        if 1.0 in cfg.a_values:
            lemma1.append(tf["alpha"][:, cfg.a_values.index(1.0)])
        for k, a in enumerate(cfg.a_values):
            alpha = tf["alpha"][:, k]
            w, e_drafted = chain_weights(tf["px"], tf["qx"], alpha, a, cfg.draft_length, cfg.max_new_tokens)
            res = runs[a]
            own = trajectory(tli, ids, res.token_ids, params, [a])["alpha"][:, 0]
            pos, acc = verified_positions(res.stats, len(res.token_ids))
            on = own[pos - 1]
            per[a][-1].update(positions=alpha.size, alpha_sum=float(alpha.sum()), w_sum=float(w.sum()),
                              w_alpha=float(w @ alpha), e_drafted=e_drafted,
                              verified=sum(min(d, n + 1) for d, n in zip(res.stats.drafted_per_step,
                                                                         res.stats.accepted_per_step)),
                              on_verified=int(pos.size), on_accepted=int(acc.sum()), on_alpha=float(on.sum()),
                              on_var=float((np.clip(on, 0, 1) * (1.0 - np.clip(on, 0, 1))).sum()))
    rows = summarise(per, cfg)
    sd = np.concatenate(sd_vals) if sd_vals else np.zeros(0)
    check = None
    if lemma1:
        l1 = np.concatenate(lemma1)
        check = {"positions": int(sd.size), "sd_alpha_mean": float(sd.mean()) if sd.size else None,
                 "lemma_at_1_mean": float(l1.mean()) if l1.size else None,
                 "max_abs_diff": float(np.abs(l1 - sd).max()) if sd.size else None}
    doc = {"format": "edgespec-randomised-study", "schema_version": 1, "settings": settings(cfg),
           "models": {"bundle": str(cfg.bundle), "pair": bundle.manifest.get("pair"), "kept": bundle.kept,
                      "target_vocab": bundle.target.vocab_size, "providers": tli.providers},
           "prompts": len(encoded), "sd_check": check, "rows": rows,
           "generations": {str(k): v for k, v in per.items()}, "elapsed_s": round(time.time() - t0, 1)}
    for dec in decs.values():
        dec.close()
    write(doc, Path(cfg.out))
    return doc


def summarise(per: dict, cfg: RandomisedConfig) -> list[dict]:
    ar = per["ar"]
    ar_tps = sum(r["decode_tokens"] for r in ar) / max(sum(r["decode_s"] for r in ar), 1e-12)
    rows = [{"a": 0.0, "strategy": "ar", "prompts": len(ar), "decode_tokens_per_s": ar_tps, "speedup": 1.0}]
    for a in cfg.a_values:
        g = per[a]
        col = lambda k: [r[k] for r in g]       # noqa: E731
        row = {"a": a, "strategy": "tli", "prompts": len(g), "positions": sum(col("positions")),
               "drafted": sum(col("drafted")), "verified": sum(col("verified")), "accepted": sum(col("accepted"))}
        for name, num, den in (("acceptance_runtime", "accepted", "drafted"),
                               ("acceptance_verified", "accepted", "verified"),
                               ("predicted_uniform", "alpha_sum", "positions"),
                               ("predicted_chain", "w_alpha", "w_sum"), ("predicted_runtime", "w_alpha", "e_drafted")):
            row[name], row[name + "_se"] = ratio(col(num), col(den))
        row["chain_minus_uniform"], row["chain_minus_uniform_se"] = difference(
            (col("w_alpha"), col("w_sum")), (col("alpha_sum"), col("positions")))
        n_on = sum(col("on_verified"))
        row["on_run_measured"] = sum(col("on_accepted")) / n_on if n_on else float("nan")
        row["on_run_predicted"] = sum(col("on_alpha")) / n_on if n_on else float("nan")
        se = np.sqrt(sum(col("on_var"))) / n_on if n_on else float("nan")
        row["on_run_se"] = float(se)
        row["on_run_z"] = float((row["on_run_measured"] - row["on_run_predicted"]) / se) if se and se > 0 else None
        row["decode_tokens_per_s"] = sum(col("decode_tokens")) / max(sum(col("decode_s")), 1e-12)
        row["speedup"] = row["decode_tokens_per_s"] / ar_tps if ar_tps > 0 else float("nan")
        rows.append(row)
    return rows


# --------------------------------------------------------------------------- outputs

def settings(cfg: RandomisedConfig) -> dict:
    d = asdict(cfg)
    d["bundle"], d["out"] = str(cfg.bundle), str(cfg.out)
    return d


def write(doc: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    doc["plots"] = plot(doc, out / "randomised.png")
    tmp = out / "randomised.json.tmp"
    tmp.write_text(json.dumps(_finite(doc), indent=1, ensure_ascii=False, default=float) + "\n", encoding="utf-8")
    os.replace(tmp, out / "randomised.json")
    with open(out / "randomised.csv", "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=CSV_FIELDS, extrasaction="ignore")
        w.writeheader()
        for r in doc["rows"]:
            if r["strategy"] != "ar":
                w.writerow(r)


def _finite(x):
    """The document with NaN (an SE from one prompt, a ratio over nothing) as null: strict JSON."""
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_finite(v) for v in x]
    return None if isinstance(x, float) and x != x else x


def plot(doc: dict, path: Path) -> list[str]:
    try:
        import matplotlib           # lazy: optional (edgespec[bench]), on the Agg backend
    except ImportError:
        print("edgespec: warning: matplotlib is not installed: no plot", file=sys.stderr)
        return []
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: matplotlib is optional (plots only)

    rows = [r for r in doc["rows"] if r["strategy"] != "ar"]
    a = [r["a"] for r in rows]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    left.errorbar(a, [r["acceptance_verified"] for r in rows], yerr=[r["acceptance_verified_se"] for r in rows],
                  fmt="o", capsize=3, label="measured: accepted / verified drafts")
    left.plot(a, [r["predicted_uniform"] for r in rows], "-", label="Lemma 4.1, mean over positions")
    left.plot(a, [r["predicted_chain"] for r in rows], "--", label="Lemma 4.1, chain-weighted")
    left.plot(a, [r["on_run_predicted"] for r in rows], "x", label="Lemma 4.1 on the run's verified positions")
    left.plot(a, [r["acceptance_runtime"] for r in rows], "s", mfc="none", label="runtime accepted / drafted")
    left.set(xlabel="drafting probability a", ylabel="acceptance", title="acceptance: measured vs Lemma 4.1")
    left.legend(fontsize=7)
    right.plot(a, [r["decode_tokens_per_s"] for r in rows], "o-", label="tli, randomised")
    right.axhline(doc["rows"][0]["decode_tokens_per_s"], ls=":", color="gray", label="ar")
    for r in rows:
        right.annotate(f"{r['speedup']:.2f}x", (r["a"], r["decode_tokens_per_s"]), fontsize=7,
                       textcoords="offset points", xytext=(0, 6), ha="center")
    right.set(xlabel="drafting probability a", ylabel="decode tokens/s", title="throughput against a")
    right.legend(fontsize=7)
    s = doc["settings"]
    fig.suptitle(f"{doc['models']['pair'] or doc['models']['bundle']}: {doc['prompts']} prompts x "
                 f"{s['max_new_tokens']} tokens, T={s['temperature']:g}, γ={s['draft_length']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return [path.name]


def table(doc: dict) -> str:
    lines = ["| a | measured (verified) | Lemma 4.1 mean | chain-weighted | on-run (z) | runtime acc. "
             "(pred.) | decode tok/s | speedup |", "|---|---|---|---|---|---|---|---|"]
    def f(v, e=None) -> str:
        if v is None or v != v:
            return "-"
        return f"{v:.3f}" if e is None or e != e else f"{v:.3f} ± {e:.3f}"

    for r in doc["rows"]:
        if r["strategy"] == "ar":
            lines.append(f"| ar | | | | | | {r['decode_tokens_per_s']:.1f} | 1.00 |")
            continue
        z = "-" if r["on_run_z"] is None else f"{r['on_run_z']:+.1f}"
        lines.append(f"| {r['a']:g} | {f(r['acceptance_verified'], r['acceptance_verified_se'])} | "
                     f"{f(r['predicted_uniform'], r['predicted_uniform_se'])} | {f(r['predicted_chain'])} | "
                     f"{f(r['on_run_predicted'])} ({z}) | {f(r['acceptance_runtime'])} ({f(r['predicted_runtime'])}) | "
                     f"{r['decode_tokens_per_s']:.1f} | {r['speedup']:.2f} |")
    return "\n".join(lines)
