"""Verification of a block of drafts against one target forward (Algorithm 5 of the
heterogeneous-vocabularies paper; Algorithm 4 of the RDK paper), vectorised like gpt-fast.

Inputs for a block of n drafts d_1..d_n (target ids):
- target rows p_0..p_n: p_j is the target's distribution after the committed context + d_1..d_j
  (row 0 predicts d_1, row n predicts the bonus token);
- draft rows q_0..q_{n-1}: the distribution d_{j+1} was actually sampled from (over target ids).

Sampled verify (temperature > 0), for j = 1..n: accept d_j with probability min(1, p(d_j)/(a q(d_j)));
at the first rejection emit t ~ norm(max(p - a q, 0)) at that position and stop; if all n are accepted
emit a bonus t ~ p_n. With a = 1 this is standard rejection sampling. a < 1 is the randomised-drafting
rule (draft with probability a): `terminal_nodraft=True` then says the block ended on a position
where the coin said "no draft": its q row (row n of q) is given, and after accepting everything the
last token comes from the residual norm(max(p_n - a q_n, 0)) instead of from p_n.

Per position the output law is exactly p:  P(x) = min(a q(x), p(x)) + (1 - sum min(a q, p)) r(x) = p(x),
since 1 - sum min(a q, p) = sum max(p - a q, 0) (sum p = 1 >= a = sum a q).

Greedy verify (temperature 0): accept while d_j equals the target's argmax; emit the target's argmax at
the first mismatch (or the bonus argmax).
"""
from __future__ import annotations

import numpy as np

from edgespec.runtime.samplers.sampling import sample


def accept_probability(p_at: np.ndarray, q_at: np.ndarray, a: float = 1.0) -> np.ndarray:
    """min(1, p/(a q)) elementwise, for the drafted tokens' probabilities (q > 0 wherever a token was drafted)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        r = np.where(q_at > 0, p_at / (a * q_at), 1.0)
    return np.minimum(r, 1.0)


def residual(p_row: np.ndarray, q_row: np.ndarray, a: float = 1.0, out: np.ndarray | None = None) -> np.ndarray:
    """norm(max(p - a q, 0)); falls back to p when the residual mass is 0 (then rejection had probability 0
    and this is only reached through float rounding)."""
    if a != 1.0:
        out = np.multiply(q_row, -a, out=out)
        out += p_row
    else:
        out = np.subtract(p_row, q_row, out=out)
    np.maximum(out, 0.0, out=out)
    mass = out.sum()
    if not mass > 0.0:
        out[:] = p_row
        mass = out.sum()
    out /= mass
    return out


def verify_sampled(p: np.ndarray, q: np.ndarray, drafts: np.ndarray, rng, a: float = 1.0,
                   terminal_nodraft: bool = False, work: np.ndarray | None = None) -> tuple[int, int]:
    """(number of accepted drafts, the token emitted after them).

    p: [n+1, V] target probabilities; q: [n, V] (or [n+1, V] with terminal_nodraft) draft probabilities;
    drafts: int [n]; rng: a np.random.Generator (its `random` is the only method used);
    work: optional float64 [2, V] scratch space (residual and CDF), so nothing vocab-sized is allocated."""
    res_buf, cdf_buf = (None, None) if work is None else (work[0], work[1])
    n = int(len(drafts))
    if n:
        rows = np.arange(n)
        u = rng.random(n)
        # u < min(1, p/(a q))  <=>  u * a q < p   (u in [0, 1))
        ok = u * (a * q[rows, drafts]) < p[rows, drafts]
        n_acc = n if ok.all() else int(np.argmin(ok))
    else:
        n_acc = 0
    if n_acc < n or terminal_nodraft:
        return n_acc, sample(residual(p[n_acc], q[n_acc], a, out=res_buf), rng, cdf_buf)
    return n_acc, sample(p[n], rng, cdf_buf)


def greedy_ids(rows: np.ndarray) -> np.ndarray:
    """The target's greedy ids from a verify forward: its logits rows [n, V] argmaxed, or the ids the
    graph already picked, [n] (kv.ModelRunner.forward(greedy=True)). One row: greedy_id."""
    return np.argmax(rows, axis=-1) if rows.ndim == 2 else rows


def greedy_id(row: np.ndarray) -> int:
    """greedy_ids of one row: a logits row [V], or the id the graph picked (a scalar)."""
    return int(np.argmax(row)) if np.ndim(row) == 1 else int(row)


def verify_greedy(target_logits: np.ndarray, drafts: np.ndarray) -> tuple[int, int]:
    """(number of accepted drafts, the target's argmax after them); target_logits: [n+1, V] logits, or
    the [n+1] ids the graph picked (greedy_ids)."""
    best = greedy_ids(target_logits)
    n = int(len(drafts))
    match = best[:n] == drafts
    n_acc = n if match.all() else int(np.argmin(match))
    return n_acc, int(best[n_acc])
