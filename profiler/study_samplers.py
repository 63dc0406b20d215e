"""Draft distributions of a *pruned* drafter, obtained exactly by column masking of the full head.

For one kept set S of drafter columns (a `KeptLevel`) and one position with target distribution p
(over V_t) and full-head drafter distribution q (over V_d), each sampler gives a draft distribution d
over target ids and the expected acceptance alpha = sum_x min(p(x), d(x)) (RDK paper, Def. 2.1):

- `masked`:     q restricted to S ∩ T and mapped to target ids, NOT renormalised (mass lost to pruning);
- `tli`:        the same, renormalised (TLI, what the runtime's `tli`/`sd` sample from; runtime.tli.tli_rows);
- `rdk-taylor`: Eq. 3 on the TLI distribution with the target prior and strength beta
                (edgespec.runtime.rdk.RdkTaylor: the runtime's own function);
- `rdk`:        M^T q' with the affinity M restricted to the rows of S
                (edgespec.runtime.rdk.rdk_distribution with the runtime's default tolerance).
All functions work on a chunk of positions [s, V] and never on [positions x V].
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from edgespec.runtime.rdk import Affinity, RdkTaylor, rdk_distribution
from edgespec.runtime.tli import tli_rows


@dataclass
class KeptLevel:
    percent: float
    kept: int                       # |S|
    cols: np.ndarray                # int64 [|S|] kept drafter columns (ascending)
    valid_cols: np.ndarray          # int64: kept columns with a target id
    target_ids: np.ndarray          # int64: their target ids
    unique: bool                    # no two valid columns share a target id
    taylor: dict = field(default_factory=dict)      # beta -> RdkTaylor
    affinity: dict = field(default_factory=dict)    # estimator -> Affinity over the rows of `cols`


def make_level(percent: float, ranking: np.ndarray, d2t: np.ndarray) -> KeptLevel:
    """The top round(percent% * V_d) (at least 1) drafter columns of `ranking`."""
    k = max(1, int(round(percent / 100.0 * ranking.size)))
    cols = np.sort(ranking[:k]).astype(np.int64)
    tids = d2t[cols]
    valid = cols[tids >= 0]
    target_ids = d2t[valid]
    return KeptLevel(percent, k, cols, valid, target_ids, np.unique(target_ids).size == target_ids.size)


def rows_subset(csr: tuple, rows: np.ndarray) -> tuple:
    """CSR (data, indices, indptr) restricted to `rows` (in that order)."""
    data, indices, indptr = csr
    starts = indptr[rows]
    lengths = indptr[rows + 1] - starts
    new_indptr = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    entries = np.repeat(starts - new_indptr[:-1], lengths) + np.arange(int(new_indptr[-1]))
    return data[entries], indices[entries], new_indptr


def taylor_samplers(prior: np.ndarray | None, betas: list[float]) -> dict:
    """{beta: RdkTaylor}: independent of the kept set, so shared by every level."""
    return {} if prior is None else {float(b): RdkTaylor(prior, beta=float(b)) for b in betas}


def attach_samplers(level: KeptLevel, taylor: dict, affinities: dict, n_target: int) -> None:
    """Attach the Taylor-RDK samplers and the affinity matrices restricted to the level's rows."""
    level.taylor = taylor
    for name, csr in affinities.items():
        data, indices, indptr = rows_subset(csr, level.cols)
        level.affinity[name] = Affinity.from_csr(data, indices, indptr, (level.cols.size, n_target))


def overlap(p: np.ndarray, d: np.ndarray) -> np.ndarray:
    """sum_x min(p, d) per row."""
    return np.minimum(p, d).sum(axis=1)


def level_alphas(p: np.ndarray, q: np.ndarray, level: KeptLevel, tol: float) -> dict:
    """{sampler key: alpha per row [s]} for one kept level. p: [s, V_t], q: [s, V_d] (float64)."""
    n_target = p.shape[1]
    kept_q = q[:, level.valid_cols]
    ok = kept_q.sum(axis=1) > 0                                   # rows with mass left on S ∩ T
    tli, masked = tli_rows(kept_q, level.target_ids, probs=True, dtype=np.float64, n_target=n_target, masked=True)
    out = {("masked", None): overlap(p, masked)}
    out[("tli", None)] = np.where(ok, overlap(p, tli), 0.0)
    for beta, taylor in level.taylor.items():
        d = np.stack([taylor(tli[i]) if ok[i] else np.zeros(n_target) for i in range(p.shape[0])])
        out[("rdk-taylor", beta)] = overlap(p, d)
    if level.affinity:
        pos = np.searchsorted(level.cols, level.valid_cols)       # valid columns' rows in M_S
        q_kept = np.zeros((p.shape[0], level.cols.size))
        q_kept[:, pos] = tli_rows(kept_q, level.target_ids, probs=True, dtype=np.float64)
        for name, m in level.affinity.items():
            d = np.stack([rdk_distribution(q_kept[i], m, tol=tol) if ok[i] else np.zeros(n_target)
                          for i in range(p.shape[0])])
            out[("rdk", name)] = overlap(p, d)
    return out


def sampler_label(key: tuple) -> str:
    name, arg = key
    if name == "rdk-taylor":
        return f"rdk-taylor β={arg:g}"
    if name == "rdk":
        return f"rdk M={arg}"
    return name
