"""Affinity M from tokenizer structure: drafter tokens map to target tokens by their decoded strings.

Strings are the tokens' decoded bytes (runtime/bundle/vocab.py `token_table`: byte-level `Ġ` and
SentencePiece `▁` both become a space, `<0xNN>` the byte NN), so the two tokenizer styles compare.
"The tokenizer's first token of a string" is approximated by the longest vocabulary key that is a
prefix of it (BPE's first token is that in the common case; any map keeps decoding lossless, because
the draft distribution that is sampled is also the one verified against).

  first(d)    = the longest target token that prefixes s_d: the target token a drafter token d starts
                with. RDK with M_d = e_first(d) is SLRS (heterogeneous-vocabularies paper, Alg. 3) with
                a lookahead of ONE drafter token: psi_1(t) = sum_{d: first(d) = t} q(d).
  parent(t)   = the longest drafter token that prefixes s_t: the drafter token that starts spelling t.
  prefix M:   M_d. ∝ prior(t) over {first(d)} ∪ {t : parent(t) = d}, at most k entries per row (first(d)
                always kept, the others by prior). The children {t : parent(t) = d} are target tokens
                the drafter can only spell with d followed by more tokens: the one M family here that
                proposes target tokens outside the drafter's vocabulary. The prior is the target's mean
                next-token distribution over the calibration positions (no zeros for unseen tokens).
Rows of drafter ids without a decodable string (added specials) keep the exact map where the token
has a target id. Unlike cooc/cov, rows of drafter tokens outside the target vocabulary are
non-empty: these estimators are meant for q over ALL kept columns, not the TLI q' (study_samplers.py).
"""
from __future__ import annotations

import numpy as np

from edgespec.calibrate.sparse_rows import by_row, row_pointers, top_k_per_row
from edgespec.errors import CalibrationError
from edgespec.runtime.round.slrs import MAX_KEY_BYTES, key_index, longest_prefix_ids, text_keys


def prefix_ids_csr(strings: list, vocab: dict) -> tuple[np.ndarray, np.ndarray]:
    """For each string, ALL `vocab` ids whose keys prefix it, as (row of each entry, id) arrays."""
    longest = min(max((len(k) for k in vocab), default=0), MAX_KEY_BYTES)
    rows, ids = [], []
    for i, s in enumerate(strings):
        for n in range(1, min(len(s or b""), longest) + 1):
            j = vocab.get(s[:n])
            if j is not None:
                rows.append(i)
                ids.append(j)
    return np.asarray(rows, dtype=np.int64), np.asarray(ids, dtype=np.int64)


class TokenStructure:
    """first(d), parent(t) and canonical drafter ids of one (target, drafter) tokenizer pair."""

    def __init__(self, target_tok, drafter_tok, n_target: int, n_drafter: int):
        self.t_keys = text_keys(target_tok, n_target)
        self.d_keys = text_keys(drafter_tok, n_drafter)
        self.t_index, self.d_index = key_index(self.t_keys), key_index(self.d_keys)
        self.first = longest_prefix_ids(self.d_keys, self.t_index)          # [V_d] target id or -1
        self.parent = longest_prefix_ids(self.t_keys, self.d_index)         # [V_t] canonical drafter id or -1
        self.canonical = np.array([self.d_index.get(k, -1) if k else -1 for k in self.d_keys], dtype=np.int64)
        # ambiguous drafter strings: some target token strictly extends them (the first target token of
        # "s_d + more text" is not fixed by d alone; SLRS needs more lookahead there)
        self.extended = np.zeros(len(self.d_keys), dtype=bool)
        rows, ids = prefix_ids_csr(self.t_keys, self.d_index)
        strict = np.array([len(self.d_keys[j]) < len(self.t_keys[r]) for r, j in zip(rows, ids)], dtype=bool)
        ext_canon = np.zeros(len(self.d_keys), dtype=bool)
        ext_canon[ids[strict]] = True
        self.extended = (self.canonical >= 0) & ext_canon[np.maximum(self.canonical, 0)]
        self.extends_rows, self.extends_ids = rows[strict], ids[strict]   # t strictly extends canonical d


def _rows_csr(rows: np.ndarray, cols: np.ndarray, vals: np.ndarray, n_rows: int):
    rows, cols, vals = by_row(rows, cols, vals)
    return vals, cols, row_pointers(rows, n_rows)


def first_or_exact(structure: TokenStructure, index_map: np.ndarray | None) -> np.ndarray:
    """first(d), or the exact map (added specials: no string) where d has no first target token."""
    if index_map is None:
        return structure.first
    return np.where(structure.first >= 0, structure.first, np.asarray(index_map, dtype=np.int64))


def first_token_csr(structure: TokenStructure, index_map: np.ndarray | None = None) -> tuple:
    """M_d = e_first(d): SLRS with one drafter token of lookahead."""
    first = first_or_exact(structure, index_map)
    has = np.flatnonzero(first >= 0)
    return _rows_csr(has, first[has], np.ones(has.size), first.size)


def prefix_csr(structure: TokenStructure, prior: np.ndarray, k: int, index_map: np.ndarray | None = None) -> tuple:
    """M_d ∝ prior over {first(d)} ∪ children(d), first(d) always kept, the rest top-(k-1) by prior."""
    n_d = structure.first.size
    canon = structure.canonical
    kids_t = np.flatnonzero(structure.parent >= 0)
    kids_d = structure.parent[kids_t]                                   # canonical drafter id of each child
    # expand children of a canonical id to every drafter id sharing its string
    members = np.flatnonzero(canon >= 0)
    by_canon = np.argsort(canon[members], kind="stable")
    sorted_canon = canon[members][by_canon]
    lo = np.searchsorted(sorted_canon, kids_d, side="left")
    hi = np.searchsorted(sorted_canon, kids_d, side="right")
    reps = hi - lo
    rows = members[by_canon][np.repeat(lo, reps) + np.arange(int(reps.sum())) - np.repeat(np.cumsum(reps) - reps, reps)]
    cols = np.repeat(kids_t, reps)
    first = first_or_exact(structure, index_map)
    has_first = np.flatnonzero(first >= 0)
    rows = np.concatenate([rows, has_first])
    cols = np.concatenate([cols, first[has_first]])
    keys = np.unique(rows * prior.size + cols)                        # drop (d, first(d)) duplicates
    rows, cols = keys // prior.size, keys % prior.size
    is_first = np.zeros(rows.size, dtype=bool)
    is_first[np.searchsorted(keys, has_first * prior.size + first[has_first])] = True
    weight = prior[cols].astype(np.float64) + 1e-30
    sel = top_k_per_row(rows, cols, weight + 2.0 * is_first, k)         # per row: first(d), then by prior
    rows, cols, weight = rows[sel], cols[sel], weight[sel]
    weight = weight / np.bincount(rows, weights=weight, minlength=n_d)[rows]
    return _rows_csr(rows, cols, weight, n_d)


class StructuralEstimator:
    """`prefix` or `first` affinity for the study/calibration interface (add(p, q_cols), build(k))."""

    def __init__(self, name: str, index_map: np.ndarray, n_target: int, tokenizers: tuple, **_):
        if tokenizers is None:
            raise CalibrationError(f"affinity {name!r} needs both tokenizers")
        self.name = name
        self.index_map = np.asarray(index_map, dtype=np.int64)
        self.n_target = int(n_target)
        self.structure = TokenStructure(tokenizers[0], tokenizers[1], self.n_target, self.index_map.size)
        self.sum_p = np.zeros(self.n_target)
        self.n = 0

    def add(self, p: np.ndarray, q_cols: np.ndarray | None = None) -> None:
        self.sum_p += p.sum(axis=0, dtype=np.float64)
        self.n += p.shape[0]

    def build(self, k: int, **_) -> tuple[tuple, dict]:
        s = self.structure
        if self.name == "first":
            data, indices, indptr = first_token_csr(s, self.index_map)
        else:
            prior = self.sum_p / self.n if self.n else np.full(self.n_target, 1.0 / self.n_target)
            data, indices, indptr = prefix_csr(s, prior, k, self.index_map)
        fallback = int(((s.first < 0) & (self.index_map >= 0)).sum())
        lengths = np.diff(indptr)
        t2d_has = np.zeros(self.n_target, dtype=bool)
        t2d_has[self.index_map[self.index_map >= 0]] = True
        out_of_vocab = ~t2d_has[indices]
        info = {"estimator": self.name, "top_k": k if self.name == "prefix" else 1,
                "prior": "mean target distribution over calibration positions", "prior_positions": self.n,
                "rows": int((lengths > 0).sum()), "mean_row_length": float(lengths[lengths > 0].mean()),
                "rows_outside_target_vocab": int(((lengths > 0) & (self.index_map < 0)).sum()),
                "entries_outside_drafter_vocab": int(out_of_vocab.sum()),
                "target_ids_reachable": int(np.unique(indices).size), "identity_rows": fallback,
                "extended_drafter_tokens": int(s.extended.sum())}
        return (data, indices, indptr), info
