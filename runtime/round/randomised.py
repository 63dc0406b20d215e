"""Randomised drafting (randomised-drafting paper, Algorithm 2, Lemmas 4.1-4.4; docs/papers.md), chained to gamma > 1.

One position, drafting probability a in (0, 1]:
  - with probability a: draft x ~ q, accept it with probability min(1, p(x) / (a q(x))), otherwise
    emit a token from the residual r_a = norm(max(p - a q, 0));
  - with probability 1 - a: draft nothing and emit a token from r_a (this needs q at that position,
    which is why the drafter still runs: concurrently with the target's verify forward).
a = 1 is vanilla speculative sampling. Norms here are plain L1 sums, as in the paper (its "TV" is
||p - q||_1 without the usual 1/2), so the accept probability of a drafted token (Lemma 4.1) is
      (1/a) sum_x min(p(x), a q(x)) = (1 + a - ||p - a q||_1) / (2a).

Chain extension (our design; the paper's §5.1 leaves gamma > 1 open). Per iteration:
  for j = 1..gamma: flip u_j ~ U[0,1); if u_j >= a stop drafting ("no draft at j"), else draft d_j ~ q_j.
  The target verifies d_1..d_n (n = drafts made) in one forward, the drafter meanwhile computes q_{n+1}
  if the chain stopped on a no-draft coin. Then, position by position:
    d_j accepted with min(1, p_j(d_j) / (a q_j(d_j))); at the first rejection emit from r_a at j, stop;
    if all n are accepted: no-draft stop -> emit from r_a(p_{n+1}, q_{n+1}); full chain -> bonus from p_{n+1}.

Why it is lossless. Condition on the committed prefix x_<j at some position j. Whatever happened
before, the token emitted at j is produced by exactly one of:
  (i)  one step of Algorithm 2 with a fresh coin u_j, a fresh draw d_j ~ q_j(. | x_<j) and fresh
       acceptance/residual randomness: drafting at j was not stopped before reaching j, the coin u_j
       is independent of everything used for positions < j, and d_j was drawn from the drafter
       conditioned on the accepted drafts, which *are* x_<j. Lemma 4.2 (Appendix A.4) says this
       emits x_j ~ p_j(. | x_<j).
  (ii) the bonus at the end of a full chain: a direct draw from p_j(. | x_<j).
Which of (i)/(ii) applies is decided by the number of coins flipped so far in this iteration
(j <= gamma or not), a function of the past only, never of the token about to be emitted. Whether
the iteration *continues* after j depends on the outcome at j (accepted draft vs residual), but the
next position again meets (i) or (ii) with fresh randomness: in the same iteration (its coin and
draft were drawn before the verify, independently of the acceptance test at j, and d_{j+1} was
drawn conditioned on d_j = x_j), or as position 1 of the next iteration. So every position is
emitted from the target's conditional p_j(. | x_<j), and by the chain rule the whole sequence has the
target's law. At temperature 0 p is a point mass: an accepted draft and the residual both give the
target's argmax, so the output equals greedy `ar` token for token (the decoder then skips the coins).

Where it runs: `SpeculativeDecoder(..., draft_probability=a | "auto")` (auto = the bundle's a*), with
any token-level strategy (sd, tli, rdk-taylor, rdk), sampled (at temperature 0 the decoder skips the
coins). `draft_randomised` is that round's proposer: it flips the coins first (`chain_length`: they are
independent of q), drafts n tokens (rounds.draft_tokens), and starts the no-draft position's drafter
forward on the decoder's worker thread (`SideRunner`) while the target verifies (decoder option
concurrent_draft=False: the same forward before the verify, same law and same draws); the draft's
`finish` hook turns its row into the draft's last q row after the verify forward.
verify.verify_sampled does the per-position accept/residual rule.
"""
from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable

import numpy as np

from edgespec.runtime.round.rounds import Draft, draft_tokens
from edgespec.runtime.samplers.verify import residual


def acceptance_rate(p: np.ndarray, q: np.ndarray, a: float) -> float:
    """Lemma 4.1: P(accept | a token was drafted) = (1 + a - ||p - a q||_1) / (2a)."""
    return (1.0 + a - float(np.abs(p - a * q).sum())) / (2.0 * a)


def output_distribution(p: np.ndarray, q: np.ndarray, a: float) -> np.ndarray:
    """The exact law of the token one step of Algorithm 2 emits (for tests and analysis):
    min(a q, p) (drafted and accepted) + (a (1 - alpha_a) + (1 - a)) r_a. Lemma 4.2: it equals p."""
    drafted_and_accepted = np.minimum(a * q, p)
    alpha_a = drafted_and_accepted.sum() / a
    return drafted_and_accepted + (a * (1.0 - alpha_a) + (1.0 - a)) * residual(p, q, a)


def chain_length(rng: np.random.Generator, a: float, gamma: int) -> tuple[int, bool]:
    """Flip the per-position coins: (number of drafts n <= gamma, stopped_by_no_draft).
    stopped_by_no_draft is False only when all gamma coins came up 'draft'."""
    for j in range(gamma):
        if rng.random() >= a:
            return j, True
    return gamma, False


def draft_randomised(gen, gamma: int) -> Draft:
    """The randomised round's proposal: coins, then n drafts; when a coin said "no draft" (and no
    confidence stop came first: a function of the drafts, not of a draw) the q of that position is
    still needed, so its drafter forward starts now and `finish` collects it after the verify."""
    n, stopped = chain_length(gen.rng, gen.config.draft_probability, gamma)
    draft = draft_tokens(gen, n)
    if not stopped or len(draft.tokens) < n:
        return draft
    ids = gen.drafter_ctx.inputs()
    prefill = gen.starts_fill()
    t_submit = None
    # ORT captures a CUDA graph with global capture mode: no other thread may use the GPU meanwhile
    if gen.config.concurrent_draft and not (gen.target.captures or gen.drafter.captures):
        t_submit = time.perf_counter()
        pending = gen.shared.side_runner().submit(gen.drafter.forward, ids, 1)    # last row only
    else:
        pending = Future()
        pending.set_result(gen.drafter.forward(ids, 1))
    draft.q = gen.q_rows[:n + 1]

    def finish() -> None:
        row = pending.result()[-1]
        gen.book_draft_forward(prefill, overlap_from=t_submit)
        gen.draft_q(row, draft.q[n])

    draft.finish = finish
    return draft


class SideRunner:
    """One persistent worker thread that runs a callable (the drafter's no-draft forward) while the
    caller runs another (the target's verify forward). ORT releases the GIL inside `session.run`, so
    the two forwards overlap when the machine has a free core; each session keeps its own
    intra-op thread count (1 by default on <= 2 cores)."""

    def __init__(self):
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="edgespec-drafter")

    def submit(self, fn: Callable, *args) -> Future:
        return self._pool.submit(fn, *args)

    def close(self) -> None:
        self._pool.shutdown(wait=True)
