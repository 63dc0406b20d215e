"""What a non-CPU EP's kernels do with a runner's graph, measured when the runner is made.

`check_device_session(runner, session_ep, exact)` (kv.ModelRunner calls it for every session whose
first EP is not the CPU's) settles two things on the machine itself, in a few forwards of a fresh
cache, and says once what a user should know:
- the KV layout (runtime/engine/placement.py): the shared buffers in the memory of the EP that runs
  attention, kept only if `shared_layout_diff` finds the shared layout's logits equal to the copy
  layout's; else the copy layout;
- 1-token steps: where a 1-token step computes other bits than the same position inside a 4-token
  forward (`one_token_steps_exact`; CUDA's one-row GEMV path does, while its 2- and 4-token forwards
  agree bitwise: docs/results.md), an exact runner pads
  them to 2 tokens (`min_tokens`), as the CPU EP's int4 graphs do, so that `ar` and every verify
  compute the same function.
Each probe leaves the cache empty and the runner's counters as they were.
"""
from __future__ import annotations

import contextlib
import dataclasses
import warnings

import numpy as np

from edgespec.runtime.engine.placement import DEVICE, KVPlacement, kv_placement, read_placement

# the shared layout is sound where its logits are within this share of the copy layout's largest logit
# (fp16 kernels differ by ~1e-3 of it; a cache written off its device by 0.5 and more)
LAYOUT_TOLERANCE = 0.02


@contextlib.contextmanager
def _probing(runner):
    """Run probe forwards on `runner`: the cache is emptied after, the counters restored."""
    counts = dataclasses.replace(runner.counts)
    try:
        yield _probe_ids(runner.vocab)
    finally:
        runner.reset()
        runner.counts = counts


def prefill_chunks_exact(runner, tokens: int = 16) -> bool:
    """Whether the runner's prefill graph gives the same bits for `tokens` ids in one forward and in two
    halves on this machine (MLAS's fp32 kernels do on x86-64)."""
    with _probing(runner):
        ids = _probe_ids(runner.vocab, tokens)
        runner.reset()
        whole = runner.forward(ids, last=1, prefill_graph=True)[-1].copy()
        runner.reset()
        runner.forward(ids[:tokens // 2], last=1, prefill_graph=True)
        halves = runner.forward(ids[tokens // 2:], last=1, prefill_graph=True)[-1]
        return bool(np.array_equal(whole, halves))


def _probe_ids(vocab: int, n: int = 8) -> list[int]:
    return (np.arange(n) * 7919 % max(1, vocab - 1) + 1).tolist()


def check_device_session(runner, session_ep: str, exact: bool) -> int:
    """At load on a non-CPU EP: the KV layout that is sound there (choose_kv_layout), and the forward
    width the runner needs: 2 where 1-token steps compute other bits than wider ones, else its own."""
    if runner.shared:
        choose_kv_layout(runner, session_ep)
    if exact and runner.min_tokens < 2 and not one_token_steps_exact(runner):
        return 2
    return runner.min_tokens


def choose_kv_layout(runner, session_ep: str) -> None:
    """Keep the shared layout where it is sound (module docstring), else the copy layout."""
    where = kv_placement(read_placement(runner.session), session_ep, runner.role)
    if where.ep is None:
        runner.use_layout(shared=False)
    else:
        runner.device = DEVICE.get(where.ep, "cpu")
        diff = shared_layout_diff(runner)
        if not diff <= LAYOUT_TOLERANCE:
            runner.use_layout(shared=False)
            where = KVPlacement(None, f"{runner.role}: the shared KV layout gave other logits than the copy layout "
                                      f"on {session_ep} (max |diff| {diff:.3g} of the largest logit); the cache is "
                                      "copied between steps")
    runner.reset()
    if where.reason:
        warnings.warn(where.reason, RuntimeWarning, stacklevel=5)


def shared_layout_diff(runner, tokens: int = 4) -> float:
    """Max |diff| between the shared and the copy layout's logits, relative to the largest logit (at
    least 1), over a prefill of `tokens` ids, a 1-token and a 2-token step."""
    runs = []
    with _probing(runner) as ids:
        for shared in (True, False):
            runner.use_layout(shared)
            # copies: a forward's logits are valid until the next forward
            runs.append(np.concatenate([runner.forward(ids[:tokens], pad=False).copy(),
                                        runner.forward(ids[tokens:tokens + 1], pad=False).copy(),
                                        runner.forward(ids[tokens + 1:tokens + 3], pad=False).copy()]))
        runner.use_layout(shared=True)
    return float(np.max(np.abs(runs[0] - runs[1])) / max(1.0, float(np.max(np.abs(runs[1])))))


def one_token_steps_exact(runner) -> bool:
    """Whether a 1-token step gives the bits of the same position inside a 4-token forward; says once
    where 2- and 4-token forwards differ too (no padding then makes a verify bit-exact with plain steps)."""
    rows = {}
    with _probing(runner) as ids:
        runner.forward(ids[:4], pad=False)
        for k in (1, 2, 4):
            runner.crop(4)
            rows[k] = runner.forward(ids[4:4 + k], pad=False)[0].copy()
    if not np.array_equal(rows[2], rows[4]):
        warnings.warn(f"{runner.role}: 2- and 4-token forwards give other logits on this EP, so a verify forward is "
                      "not bit-exact with plain steps: greedy speculative output can differ from ar's where the top "
                      "two logits nearly tie", RuntimeWarning, stacklevel=5)
    return bool(np.array_equal(rows[1], rows[4]))
