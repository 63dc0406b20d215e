"""Memory-bound speed-up (VocabTrim) and the three cost ratios c, as pure functions.

    MBSU = tau / (c * gamma + 1)        (VocabTrim paper, §4.1 "Performance Metrics"; docs/papers.md)

c is the drafter's relative cost per forward, computed three ways:
- `c_params`: pruned drafter parameters / target parameters (VocabTrim's definition);
- `c_bytes`:  drafter / target bytes of weights read per forward (manifest `bytes_per_forward`: an
              embedding gather reads one row, the pruned head reads K rows);
- `c_time`:   measured drafter step time / target decode step time on the execution provider used.

realisation = measured speedup / MBSU(c_time): the share of the memory-bound promise delivered.
"""
from __future__ import annotations

import statistics


def mbsu(tau: float | None, c: float | None, gamma: int) -> float | None:
    """tau / (c gamma + 1); None when tau or c is unknown. gamma = 0 (ar) gives tau."""
    if tau is None:
        return None
    if gamma == 0:
        return float(tau)
    if c is None:
        return None
    return float(tau) / (float(c) * gamma + 1.0)


def expected_tau(alpha: float, gamma: int) -> float:
    """Block efficiency for i.i.d. acceptance alpha and gamma drafts: (1 - alpha^(gamma+1)) / (1 - alpha)."""
    if alpha >= 1.0:
        return float(gamma + 1)
    return (1.0 - alpha ** (gamma + 1)) / (1.0 - alpha)


def ratio(num: float | None, den: float | None) -> float | None:
    if num is None or den is None or not den:
        return None
    return float(num) / float(den)


def _target_params(manifest: dict) -> int | None:
    t = manifest.get("target", {})
    return t.get("graph_params") or t.get("params")


def drafter_params(manifest: dict) -> int | None:
    """Parameters of the pruned drafter as exported (falls back to the full model's count)."""
    d = manifest.get("drafter", {})
    return d.get("params_pruned") or d.get("params")


def c_params(manifest: dict) -> float | None:
    """Pruned drafter parameters / target parameters, both counted over the exported graphs."""
    return ratio(drafter_params(manifest), _target_params(manifest))


def c_bytes(manifest: dict) -> float | None:
    """Drafter / target weight bytes read per forward (manifest `bytes_per_forward`)."""
    return ratio(manifest.get("drafter", {}).get("bytes_per_forward") or None,
                 manifest.get("target", {}).get("bytes_per_forward") or None)


def c_time(draft_step_ms: float | None, target_decode_ms: float | None) -> float | None:
    """Measured drafter step / target 1-token decode step on this execution provider."""
    return ratio(draft_step_ms, target_decode_ms)


def params_at_kept(manifest: dict, kept: int) -> int | None:
    """Drafter parameters if its head kept `kept` rows instead of the bundle's K (the head is K x hidden)."""
    d = manifest.get("drafter", {})
    base, k0, hidden = drafter_params(manifest), d.get("kept"), d.get("hidden_size")
    if base is None or k0 is None or hidden is None:
        return None
    return int(base + (int(kept) - int(k0)) * int(hidden))


def weight_bytes_read(manifest: dict, target_forwards: int, draft_forwards: int) -> int | None:
    """Bytes of weights read by target_forwards target runs and draft_forwards drafter runs."""
    t = manifest.get("target", {}).get("bytes_per_forward") or 0
    d = manifest.get("drafter", {}).get("bytes_per_forward") or 0
    if not t:
        return None
    return int(t * target_forwards + d * draft_forwards)


def median(values) -> float | None:
    vals = [float(v) for v in values if v is not None]
    return statistics.median(vals) if vals else None
