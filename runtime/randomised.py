"""Randomised drafting (randomised-drafting.md, Algorithm 2, Lemmas 4.1-4.4), chained to gamma > 1.

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
any token-level strategy (sd, tli, rdk-taylor, rdk); verify.verify_sampled does the per-position
accept/residual rule. `randomised_round` below is the round used at temperature > 0: it flips the
coins first and runs the no-draft drafter forward on a worker thread while the target verifies
(option concurrent_draft=False: Generation.token_round's sequential path, same law).
"""
from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable

import numpy as np

from edgespec.runtime.verify import residual


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


# --------------------------------------------------------------------------- the concurrent round

def randomised_round(gen, gamma: int) -> list[int]:
    """One round of randomised drafting (temperature > 0) that runs the no-draft drafter forward on
    the worker thread while the target's verify forward runs here (decoder option
    `concurrent_draft`, default on). Same law as Generation.token_round's sequential path: the coins
    are flipped first (they are independent of q), then the n drafts are made as usual."""
    from edgespec.runtime.sampling import probabilities, sample
    from edgespec.runtime.verify import verify_sampled

    dec, st, params, rng = gen.dec, gen.stats, gen.params, gen.rng
    ctx, a = gen.ctx, dec.draft_probability
    n, no_draft = chain_length(rng, a, gamma)
    drafts: list[int] = []
    marks: list[int] = []
    for j in range(n + no_draft):
        if gen.drafter.length == len(ctx.ids):            # nothing new to feed: re-run the last token
            gen.drafter.crop(gen.drafter.length - 1)
        if j == n:                                        # the no-draft position: q only, concurrently
            pending = ctx.ids[gen.drafter.length:]
            was_prefill = gen.drafter.length == 0
            side = getattr(dec, "_side_runner", None) or SideRunner()
            dec._side_runner = side
            t_submit = time.perf_counter()
            future = side.submit(gen.drafter.forward, pending)
            break
        row = gen.draft_forward(ctx.ids[gen.drafter.length:])
        x = sample(gen.draft_q(row, j), rng, dec.work[1])
        drafts.append(x)
        marks.append(len(ctx.ids))
        ctx.ids.extend(ctx.feed_ids(x))
    try:
        logits = gen.target.forward([gen.last, *drafts])
    finally:                                              # never leave the drafter running behind us
        row = future.result()[-1] if no_draft else None
    st.record_verify(n + 1, gen.target.last_ms)
    if no_draft:
        ms = gen.drafter.last_ms
        st.draft_forwards += 1
        st.overlap_ms += max(0.0, ms + gen.target.last_ms - (time.perf_counter() - t_submit) * 1e3)
        if was_prefill:                                   # the drafter's prefill ran in this round
            st.prefill_ms += ms
        else:
            st.draft_ms += ms
            st.draft_ms_steps.append(ms)
        gen.draft_q(row, n)
    p = probabilities(logits, params, out=dec.p_rows[:n + 1])
    d = np.asarray(drafts, dtype=np.int64)
    n_acc, t = verify_sampled(p, dec.q_rows[:n + no_draft], d, rng, a, no_draft, work=dec.work)
    gen.target.crop(gen.target.length - (n - n_acc))
    if n_acc < n:
        del ctx.ids[marks[n_acc]:]
    gen.drafter.crop(min(gen.drafter.length, ctx.append_target(t)))
    st.record_block(n, n_acc)
    gen.last = t
    return [*drafts[:n_acc], t]
