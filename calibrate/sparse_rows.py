"""Sparse rows as (rows, cols, vals) triples: the k best entries of each row, and CSR from triples.
Shared by the affinity estimators (priors.py's co-occurrence/covariance, prefix_affinity.py's prefix)."""
from __future__ import annotations

import numpy as np


def top_k_per_row(rows: np.ndarray, cols: np.ndarray, score: np.ndarray, k: int) -> np.ndarray:
    """Positions of the k highest-scoring entries of each row (ties: the lower column first), grouped
    by row in that order."""
    order = np.lexsort((cols, -score, rows))
    ranked = rows[order]
    start = np.searchsorted(ranked, ranked, side="left")
    return order[(np.arange(order.size) - start) < k]


def by_row(rows: np.ndarray, cols: np.ndarray, vals: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The triples sorted by row, then column (CSR order)."""
    order = np.lexsort((cols, rows))
    return rows[order], cols[order], vals[order]


def row_pointers(rows: np.ndarray, n_rows: int) -> np.ndarray:
    """CSR indptr of row-sorted entries."""
    return np.concatenate([[0], np.cumsum(np.bincount(rows, minlength=n_rows))]).astype(np.int64)
