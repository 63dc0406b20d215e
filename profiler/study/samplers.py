"""Draft distributions of a *pruned* drafter, obtained exactly by column masking of the full head.

For one kept set S of drafter columns (a `KeptLevel`) and one position with target distribution p
(over V_t) and full-head drafter distribution q (over V_d), each sampler gives a draft distribution d
over target ids and the expected acceptance alpha = sum_x min(p(x), d(x)) (RDK paper, Def. 2.1):

- `masked`:     q restricted to S ∩ T and mapped to target ids, NOT renormalised (mass lost to pruning);
- `union`:      the pruned drafter's own law q_S = q|S / q(S), restricted to T, NOT renormalised over T:
                the "union" baseline (heterogeneous-vocabularies paper, Alg. 1 / Thm. 4.1, q_1); equal
                to `masked` at 100 % kept. Theorem 4.1: union <= tli;
- `tli`:        the same, renormalised (TLI, what the runtime's `tli`/`sd` sample from; runtime.tli.tli_rows);
- `rdk-taylor`: Eq. 3 on the TLI distribution with the target prior and strength beta
                (edgespec.runtime.samplers.rdk.RdkTaylor: the runtime's own function);
- `rdk`:        M^T q' with the affinity M restricted to the rows of S
                (edgespec.runtime.samplers.rdk.rdk_distribution with the runtime's default tolerance), as the
                runtime's `rdk`; for the structural `prefix`/`first` M (calibrate/prefix_affinity.py),
                whose rows also cover drafter tokens outside T, M^T q_S over ALL kept columns (the
                runtime would need q_S fed to RDK for these). M = first is SLRS with one drafter token
                of lookahead (psi_1);
- `slrs-bound`: NOT a sampler: an upper bound on the acceptance of SLRS with ANY lookahead
                (`slrs_upper_bound`), where drafter tokens some target token extends may be re-mapped.
All functions work on a chunk of positions [s, V] and never on [positions x V].
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from edgespec.runtime.samplers.rdk import Affinity, RdkTaylor, rdk_distribution
from edgespec.runtime.samplers.tli import tli_rows


ALL_COLUMN_ESTIMATORS = ("prefix", "first")      # M with rows outside T: fed q_S, not q'


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
    slrs: dict | None = None                        # arrays for slrs_upper_bound (attach_slrs_bound)


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


def attach_slrs_bound(level: KeptLevel, structure, n_target: int) -> None:
    """Per kept column: its first target token if no target token extends it (fixed under any lookahead),
    and the set C of target ids the extended kept columns can still turn into."""
    canon = structure.canonical[level.cols]
    ext = structure.extended[level.cols]
    first = structure.first[level.cols]
    kept_ext_canon = np.zeros(structure.canonical.size, dtype=bool)
    kept_ext_canon[canon[ext]] = True
    reach = np.zeros(n_target, dtype=bool)
    reach[structure.extends_rows[kept_ext_canon[structure.extends_ids]]] = True
    reach[first[ext & (first >= 0)]] = True
    fixed = (~ext) & (first >= 0)
    level.slrs = {"fixed_pos": np.flatnonzero(fixed), "fixed_first": first[fixed],
                  "ext_pos": np.flatnonzero(ext), "reach": reach}


def slrs_upper_bound(p: np.ndarray, q_s: np.ndarray, slrs: dict) -> np.ndarray:
    """sum_t min(p, psi_fixed) + min(A, sum_{t in C} (p - psi_fixed)_+) per row: psi_fixed = the first-token
    law of the columns no lookahead can change, A = q_S mass on the extended columns, C = what they can
    become. Any SLRS psi = psi_fixed + (mass A spread over C), and min(p, a + b) <= min(p, a) + min((p - a)_+, b)."""
    fixed = np.zeros_like(p)
    for i in range(p.shape[0]):
        fixed[i] = np.bincount(slrs["fixed_first"], weights=q_s[i, slrs["fixed_pos"]], minlength=p.shape[1])
    extended_mass = q_s[:, slrs["ext_pos"]].sum(axis=1)
    room = np.where(slrs["reach"][None, :], np.maximum(p - fixed, 0.0), 0.0).sum(axis=1)
    return np.minimum(1.0, overlap(p, fixed) + np.minimum(extended_mass, room))


def overlap(p: np.ndarray, d: np.ndarray) -> np.ndarray:
    """sum_x min(p, d) over the last axis (per row; a 0-d array for two vectors): the acceptance rate
    of speculative sampling with draft distribution d against target p."""
    return np.minimum(p, d).sum(axis=-1)


def level_alphas(p: np.ndarray, q: np.ndarray, level: KeptLevel, tol: float) -> dict:
    """{sampler key: alpha per row [s]} for one kept level. p: [s, V_t], q: [s, V_d] (float64)."""
    n_target = p.shape[1]
    kept_q = q[:, level.valid_cols]
    ok = kept_q.sum(axis=1) > 0                                   # rows with mass left on S ∩ T
    tli, masked = tli_rows(kept_q, level.target_ids, probs=True, dtype=np.float64, n_target=n_target, masked=True)
    mass_s = q[:, level.cols].sum(axis=1)
    out = {("masked", None): overlap(p, masked)}
    out[("union", None)] = overlap(p, masked / np.maximum(mass_s, 1e-300)[:, None])
    out[("tli", None)] = np.where(ok, overlap(p, tli), 0.0)
    for beta, taylor in level.taylor.items():
        d = np.stack([taylor(tli[i]) if ok[i] else np.zeros(n_target) for i in range(p.shape[0])])
        out[("rdk-taylor", beta)] = overlap(p, d)
    q_s = q[:, level.cols] / np.maximum(mass_s, 1e-300)[:, None]   # the pruned drafter's law over S
    q_tli = np.zeros_like(q_s)
    q_tli[:, np.searchsorted(level.cols, level.valid_cols)] = tli_rows(kept_q, level.target_ids, probs=True,
                                                                       dtype=np.float64)
    for name, m in level.affinity.items():
        # the runtime's RDK reads the TLI q'; the structural M also has rows outside T and reads q_S
        q_in = q_s if name in ALL_COLUMN_ESTIMATORS else q_tli
        q_rows = np.where((np.diff(m.indptr) > 0)[None, :], q_in, 0.0)    # columns M has a row for
        d = np.stack([rdk_distribution(q_rows[i], m, tol=tol) if q_rows[i].sum() > 0 else np.zeros(n_target)
                      for i in range(p.shape[0])])
        out[("rdk", name)] = overlap(p, d)
    if level.slrs is not None:
        out[("slrs-bound", None)] = slrs_upper_bound(p, q_s, level.slrs)
    return out


def sampler_label(key: tuple) -> str:
    name, arg = key
    if name == "rdk-taylor":
        return f"rdk-taylor β={arg:g}"
    if name == "rdk":
        return f"rdk M={arg}"
    if name == "slrs-bound":
        return "SLRS upper bound (any lookahead)"
    return name
