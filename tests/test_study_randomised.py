"""`edgespec study randomised` (profiler/study/randomised.py): end to end on the tiny bundles, and the
chain-aware prediction (`chain_weights`) against a simulation of the runtime's own chained rule."""
import json
from pathlib import Path

import numpy as np
import pytest

from edgespec.cli import main
from edgespec.errors import EdgespecError
from edgespec.profiler.study.randomised import RandomisedConfig, chain_weights, run_randomised
from edgespec.runtime.round.randomised import acceptance_rate, chain_length
from edgespec.runtime.samplers.verify import verify_sampled

PROMPTS = ["def add(a, b):\n    return", "class Counter:\n    def __init__(self):", "import os\nfor name in",
           "x = [i * i for i in"]


@pytest.fixture
def prompts_file(tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps({"id": f"p{i}", "text": t}) + "\n" for i, t in enumerate(PROMPTS)))
    return path


def test_end_to_end_on_the_self_bundle(tiny_self_bundle, prompts_file, tmp_path, capsys):
    out = tmp_path / "rd"
    rc = main(["study", "randomised", "--bundle", str(tiny_self_bundle), "--prompts", str(prompts_file),
               "--limit", "4", "--max-new-tokens", "40", "--a", "0.25,0.5,0.75,1", "--seed", "3", "--quiet",
               "--out", str(out)])
    assert rc == 0 and "| a |" in capsys.readouterr().out
    for name in ("randomised.json", "randomised.csv", "randomised.png"):
        assert (out / name).stat().st_size > 0
    doc = json.loads((out / "randomised.json").read_text())
    assert doc["prompts"] == 4 and doc["settings"]["temperature"] == 1.0
    rows = {r["a"]: r for r in doc["rows"] if r["strategy"] == "tli"}
    assert sorted(rows) == [0.25, 0.5, 0.75, 1.0]
    [ar_row] = [r for r in doc["rows"] if r["strategy"] == "ar"]
    assert len((out / "randomised.csv").read_text().splitlines()) == 1 + 4
    # Lemma 4.1 at a = 1 is vanilla SD's sum min(p, q), on the same positions
    check = doc["sd_check"]
    assert check["positions"] == rows[1.0]["positions"] > 0
    assert check["lemma_at_1_mean"] == pytest.approx(check["sd_alpha_mean"], abs=1e-12)
    assert check["max_abs_diff"] < 1e-9
    assert rows[1.0]["predicted_uniform"] == pytest.approx(check["sd_alpha_mean"], abs=1e-12)
    uniform = [rows[a]["predicted_uniform"] for a in sorted(rows)]
    for r in rows.values():
        for key in ("predicted_uniform", "predicted_chain", "predicted_runtime", "on_run_predicted",
                    "acceptance_verified", "acceptance_runtime"):
            assert -1e-9 <= r[key] <= 1 + 1e-9, (r["a"], key, r[key])
        assert r["accepted"] <= r["verified"] <= r["drafted"]
        assert r["decode_tokens_per_s"] > 0
        assert r["speedup"] == pytest.approx(r["decode_tokens_per_s"] / ar_row["decode_tokens_per_s"])
    assert all(x >= y - 1e-12 for x, y in zip(uniform, uniform[1:]))      # Lemma 4.1 decreases in a
    # the self pair (drafter = target pruned to 3/4): q = p / m on the kept set, so drafts are always
    # accepted once a <= m; at a = 1 the acceptance is the kept mass m < 1
    assert rows[0.25]["predicted_uniform"] > 0.99 and rows[1.0]["predicted_uniform"] < 0.95
    for a, r in rows.items():                                             # measured vs Lemma 4.1
        n = r["verified"]
        tol = 4 * np.sqrt(r["predicted_chain"] * (1 - r["predicted_chain"]) / n) + 0.03
        assert abs(r["acceptance_verified"] - r["predicted_chain"]) < tol, (a, r)
        assert r["on_run_z"] is None or abs(r["on_run_z"]) < 4, (a, r)
    r = rows[1.0]                                                         # the runtime's accepted / drafted
    assert r["drafted"] > r["verified"]                                   # drafts after a rejection count too
    assert abs(r["acceptance_runtime"] - r["predicted_runtime"]) < 0.1


def test_refuses_a_heterogeneous_bundle(tiny_hetero_bundle, prompts_file, tmp_path):
    with pytest.raises(EdgespecError, match="same-tokenizer"):
        run_randomised(RandomisedConfig(bundle=tiny_hetero_bundle, out=tmp_path / "o", prompts=str(prompts_file),
                                        limit=1, max_new_tokens=4, progress=False))


def _simulate(rng, P, Q, p0, a, gamma, n_tokens):
    """The runtime's chained randomised round (rounds.draft_tokens + verify.verify_sampled) on a Markov
    pair: p_j = P[x_{j-1}], q_j = Q[x_{j-1}]. Returns (drafted, verified, accepted)."""
    x = [int(rng.choice(p0.size, p=p0))]
    drafted = verified = accepted = 0
    while len(x) < n_tokens:
        g = min(gamma, n_tokens - len(x) - 1)
        n, terminal = chain_length(rng, a, g) if g > 0 else (0, False)
        drafts, prev = [], x[-1]
        for _ in range(n):
            prev = int(rng.choice(Q.shape[1], p=Q[prev]))
            drafts.append(prev)
        ctx = [x[-1], *drafts]
        p_rows = np.array([P[c] for c in ctx])
        q_rows = np.array([Q[c] for c in ctx[: n + terminal]])
        n_acc, t = verify_sampled(p_rows, q_rows, np.array(drafts, dtype=np.int64), rng, a, terminal)
        drafted, accepted, verified = drafted + n, accepted + n_acc, verified + min(n, n_acc + 1)
        x.extend([*drafts[:n_acc], t])
    return drafted, verified, accepted


@pytest.mark.parametrize("a", [0.6, 1.0])
def test_chain_weights_predict_the_chained_counts(a):
    """E[verified] = E_x[sum w], E[accepted] = E_x[sum w alpha], E[drafted] = E_x[expected drafts], x ~ p.
    The pair makes chaining select positions: token 1 is never drafted (q = 0), so the position after it
    always starts a round, while the easy position after token 0 is often a chain continuation; a filter
    that ignored which token was emitted (continuation probability a alpha_j) misses E[verified] by ~12 SE."""
    P = np.array([[0.6, 0.3, 0.05, 0.05], [0.1, 0.3, 0.3, 0.3], [0.4, 0.3, 0.2, 0.1], [0.4, 0.3, 0.1, 0.2]])
    Q = np.array([[0.65, 0.0, 0.2, 0.15], [0.0, 0.0, 0.1, 0.9], [0.7, 0.0, 0.2, 0.1], [0.7, 0.0, 0.1, 0.2]])
    p0 = np.full(4, 0.25)
    gamma, n_tokens, runs = 4, 12, 2000
    rng = np.random.default_rng(1)
    sim = np.array([_simulate(rng, P, Q, p0, a, gamma, n_tokens) for _ in range(runs)], dtype=float)
    alpha_of = np.array([acceptance_rate(P[c], Q[c], a) for c in range(4)])
    cum = P.cumsum(axis=1)
    x = np.zeros((2 * runs, n_tokens), dtype=np.int64)               # trajectories of the target alone
    x[:, 0] = rng.choice(4, size=2 * runs, p=p0)
    for j in range(1, n_tokens):
        x[:, j] = np.minimum((rng.random(2 * runs)[:, None] > cum[x[:, j - 1]]).sum(axis=1), 3)
    pred = []
    for row in x:
        prev, nxt = row[:-1], row[1:]
        w, drafted = chain_weights(P[prev, nxt], Q[prev, nxt], alpha_of[prev], a, gamma, n_tokens)
        pred.append((drafted, w.sum(), w @ alpha_of[prev]))
    pred = np.array(pred)
    z = (sim.mean(0) - pred.mean(0)) / np.sqrt(sim.var(0) / len(sim) + pred.var(0) / len(pred))
    assert np.all(np.abs(z) < 4.5), dict(zip(("drafted", "verified", "accepted"), z))


def test_summary_speedup_is_decode_rate_over_ar_worked_example():
    """By hand: ar decodes 30 + 10 tokens in 1 s + 1 s = 20 tok/s; a = 0.5 decodes 45 + 15 in 2 s =
    30 tok/s: speedup 1.5. Acceptance: 6 accepted of 8 drafted = 0.75."""
    from edgespec.profiler.study.randomised import summarise
    zeros = dict(positions=1, verified=1, alpha_sum=0.5, w_alpha=0.5, w_sum=1, e_drafted=1, on_verified=0,
                 on_accepted=0, on_alpha=0, on_var=0)
    per = {"ar": [{"decode_tokens": 30, "decode_s": 1.0}, {"decode_tokens": 10, "decode_s": 1.0}],
           0.5: [{**zeros, "decode_tokens": 45, "decode_s": 1.0, "drafted": 5, "accepted": 4},
                 {**zeros, "decode_tokens": 15, "decode_s": 1.0, "drafted": 3, "accepted": 2}]}
    ar, row = summarise(per, RandomisedConfig(bundle=Path("b"), out=Path("o"), a_values=[0.5]))
    assert ar["decode_tokens_per_s"] == 20.0 and ar["speedup"] == 1.0
    assert row["decode_tokens_per_s"] == 30.0 and row["speedup"] == 1.5
    assert row["acceptance_runtime"] == 0.75
