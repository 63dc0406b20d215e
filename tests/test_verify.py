"""Exact (enumerated, not sampled) checks of the verify step on synthetic p and q.

verify_sampled is a deterministic function of its uniforms: accept d_j iff u_j < min(1, p/(a q)),
then one inverse-CDF draw v. It is piecewise constant in (u, v), so integrating it exactly means
evaluating it at the midpoint of every piece and weighting by the piece's length."""
import itertools

import numpy as np
import pytest

from edgespec.runtime.samplers.verify import accept_probability, residual, verify_greedy, verify_sampled


class ScriptedRNG:
    """Stands in for np.random.Generator: returns the uniforms it is given, in order."""

    def __init__(self, values):
        self.values = list(values)

    def random(self, size=None):
        if size is None:
            return self.values.pop(0)
        out = np.array(self.values[:size], dtype=np.float64)
        del self.values[:size]
        return out


def _dist(rng, v, zeros=()):
    x = rng.random(v) ** 3
    x[list(zeros)] = 0.0
    return x / x.sum()


def _pieces(breaks):
    """Midpoints and lengths of the intervals of [0, 1) cut at `breaks`."""
    edges = np.unique(np.clip(np.concatenate([[0.0, 1.0], np.asarray(breaks, dtype=np.float64)]), 0, 1))
    return [((lo + hi) / 2, hi - lo) for lo, hi in zip(edges[:-1], edges[1:]) if hi > lo]


def _draw_breaks(p_row, q_row, a):
    """Breakpoints of the final inverse-CDF draw (residual or bonus distribution)."""
    return np.concatenate([np.cumsum(p_row), np.cumsum(residual(p_row, q_row, a))])


def exact_one_draft(p, q, a=1.0):
    """Exact law of (draft, n_accepted, emitted token) of verify_sampled with one draft d ~ q[0]."""
    law = {}
    for d in np.flatnonzero(q[0] > 0):
        for u, wu in _pieces([accept_probability(p[0, d], q[0, d], a)]):
            for v, wv in _pieces(np.concatenate([_draw_breaks(p[0], q[0], a), _draw_breaks(p[1], q[0], a)])):
                n, t = verify_sampled(p, q, np.array([d]), ScriptedRNG([u, v]), a)
                key = (int(d), n, t)
                law[key] = law.get(key, 0.0) + q[0, d] * wu * wv
    return law


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_accept_probability_is_sum_min_and_output_is_p(seed):
    rng = np.random.default_rng(seed)
    v = 7
    p = np.stack([_dist(rng, v, zeros=[1]), _dist(rng, v)])
    q = np.stack([_dist(rng, v, zeros=[2, 5])])
    law = exact_one_draft(p, q)
    accepted = sum(w for (_, n, _), w in law.items() if n == 1)
    assert accepted == pytest.approx(np.minimum(p[0], q[0]).sum(), abs=1e-12)
    first, bonus = np.zeros(v), np.zeros(v)
    for (d, n, t), w in law.items():
        first[d if n == 1 else t] += w
        if n == 1:
            bonus[t] += w
    np.testing.assert_allclose(first, p[0], atol=1e-12)          # the emitted token follows p exactly
    np.testing.assert_allclose(bonus / accepted, p[1], atol=1e-12)  # the bonus after an accept follows p[1]


def test_two_draft_chain_is_exact():
    """Two drafts where row 1 depends on d_1: first token ~ p0, and given d_1 = x accepted the next
    emitted token ~ p1(. | x) exactly."""
    rng = np.random.default_rng(7)
    v = 5
    p0, q0 = _dist(rng, v), _dist(rng, v, zeros=[3])
    p1 = {x: _dist(rng, v) for x in range(v)}
    q1 = {x: _dist(rng, v, zeros=[x]) for x in range(v)}
    p2 = {x: _dist(rng, v) for x in range(v)}
    first = np.zeros(v)
    second_given = np.zeros((v, v))
    for d1 in np.flatnonzero(q0 > 0):
        for d2 in np.flatnonzero(q1[d1] > 0):
            p = np.stack([p0, p1[d1], p2[d1]])
            q = np.stack([q0, q1[d1]])
            a1 = accept_probability(p0[d1], q0[d1])
            a2 = accept_probability(p1[d1][d2], q1[d1][d2])
            breaks = np.concatenate([_draw_breaks(p[j], q[min(j, 1)], 1.0) for j in range(3)])
            for (u1, w1), (u2, w2), (vv, wv) in itertools.product(_pieces([a1]), _pieces([a2]), _pieces(breaks)):
                n, t = verify_sampled(p, q, np.array([d1, d2]), ScriptedRNG([u1, u2, vv]))
                w = q0[d1] * q1[d1][d2] * w1 * w2 * wv
                emitted = [d1, d2][:n] + [t]
                first[emitted[0]] += w
                if len(emitted) >= 2:
                    second_given[emitted[0], emitted[1]] += w
    np.testing.assert_allclose(first, p0, atol=1e-12)
    for x in range(v):
        mass = second_given[x].sum()
        if mass > 0:
            np.testing.assert_allclose(second_given[x] / mass, p1[x], atol=1e-12)


@pytest.mark.parametrize("a", [0.3, 0.7, 1.0])
def test_randomised_rule_accept_rate_and_output(a):
    """Draft with probability a, accept min(1, p/(a q)), residual norm(max(p - a q, 0)): output = p,
    and the accept probability per drafted token is (1 + a - ||p - a q||_1) / (2a)."""
    rng = np.random.default_rng(3)
    v = 6
    p = np.stack([_dist(rng, v), _dist(rng, v)])
    q = np.stack([_dist(rng, v, zeros=[0])])
    law = exact_one_draft(p, q, a)
    accepted = sum(w for (_, n, _), w in law.items() if n == 1)
    assert accepted == pytest.approx((1 + a - np.abs(p[0] - a * q[0]).sum()) / (2 * a), abs=1e-12)
    out = np.zeros(v)
    acc = q[0] * np.where(q[0] > 0, accept_probability(p[0], q[0], a), 0.0)
    out += a * acc                                          # drafted and accepted
    rejected = a * (q[0].sum() - acc.sum()) + (1 - a)       # drafted and rejected, or no draft
    # the no-draft branch, enumerated through verify_sampled(terminal_nodraft=True) with 0 drafts
    nodraft = np.zeros(v)
    for vv, wv in _pieces(_draw_breaks(p[0], q[0], a)):
        n, t = verify_sampled(p[:1], q, np.array([], dtype=np.int64), ScriptedRNG([vv]), a, terminal_nodraft=True)
        assert n == 0
        nodraft[t] += wv
    np.testing.assert_allclose(nodraft, residual(p[0], q[0], a), atol=1e-12)
    out += rejected * nodraft
    np.testing.assert_allclose(out, p[0], atol=1e-12)


def test_residual_when_p_equals_q_falls_back_to_p():
    p = np.array([0.5, 0.5, 0.0])
    np.testing.assert_allclose(residual(p, p.copy()), p)


def test_verify_sampled_uses_the_first_rejection():
    p = np.array([[0.5, 0.5, 0.0], [0.1, 0.1, 0.8], [1 / 3, 1 / 3, 1 / 3]])
    q = np.array([[0.5, 0.5, 0.0], [0.0, 0.5, 0.5]])
    # d1 = 0 accepted (p = q), d2 = 1: accept prob 0.1/0.5 = 0.2; u2 = 0.5 rejects; residual = [1, 0, 0]... norm
    n, t = verify_sampled(p, q, np.array([0, 1]), ScriptedRNG([0.9, 0.5, 0.99]))
    assert n == 1
    r = residual(p[1], q[1])
    assert r[t] > 0 and t != 1
    n, t = verify_sampled(p, q, np.array([0, 1]), ScriptedRNG([0.9, 0.1, 0.0]))
    assert n == 2 and t == 0          # both accepted, bonus from p[2] at u = 0


def test_verify_greedy():
    logits = np.array([[0, 5, 1], [3, 0, 1], [0, 0, 9]], dtype=np.float32)
    assert verify_greedy(logits, np.array([1, 0])) == (2, 2)
    assert verify_greedy(logits, np.array([1, 2])) == (1, 0)
    assert verify_greedy(logits, np.array([0, 0])) == (0, 1)
    assert verify_greedy(logits[:1], np.array([], dtype=np.int64)) == (0, 1)
