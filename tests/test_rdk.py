"""RDK samplers on synthetic distributions: Eq. 3 transcription, M = I is TLI, M^T q' vs dense."""
from pathlib import Path

import numpy as np
import pytest

from edgespec.errors import BundleError
from edgespec.runtime.samplers.rdk import Affinity, RdkTaylor, rdk_distribution, rdk_taylor_distribution


def _tli_and_prior(rng, n=50, n_kept=20):
    """A TLI distribution over n target ids supported on n_kept of them, and a target prior."""
    q = np.zeros(n)
    support = rng.choice(n, n_kept, replace=False)
    q[support] = rng.dirichlet(np.full(n_kept, 0.3))
    return q, rng.dirichlet(np.full(n, 0.5))


def _eq3_by_hand(q, p, beta):
    """Eq. 3 transcribed literally, one token at a time."""
    n = len(q)
    theta = sum(p[i] * q[i] for i in range(n))
    tilde = [(n * q[i] + beta * theta * p[i]) / (n + p[i]) for i in range(n)]
    s = sum(tilde)
    return np.array([t / s for t in tilde])


@pytest.mark.parametrize("beta", [1.0, 5.0, 1000.0])
def test_taylor_matches_eq3(beta):
    rng = np.random.default_rng(1)
    q, p = _tli_and_prior(rng)
    want = _eq3_by_hand(q, p, beta)
    np.testing.assert_allclose(rdk_taylor_distribution(q, p, beta), want, rtol=1e-12, atol=1e-15)
    out = np.empty_like(q)
    got = RdkTaylor(p, beta)(q, out=out)
    assert got is out
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-15)
    # the runtime's sparse form (q' given on the kept ids only) is the same formula
    ids = np.flatnonzero(q)
    sparse = RdkTaylor(p, beta).for_columns(ids).distribution(q[ids], np.full_like(q, np.nan))
    np.testing.assert_allclose(sparse, want, rtol=1e-12, atol=1e-15)
    dup = np.concatenate([ids, ids[:3]])                 # two kept columns on one target id add up
    halves = np.concatenate([q[ids], np.zeros(3)])
    halves[:3] /= 2
    halves[-3:] = halves[:3]
    np.testing.assert_allclose(RdkTaylor(p, beta).for_columns(dup).distribution(halves, np.empty_like(q)), want,
                               rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("beta", [0.0, 1.0, 1e3, 1e9])
@pytest.mark.parametrize("dups", [False, True])
def test_taylor_greedy_argmax_without_the_dense_pass(beta, dups):
    """KeptTaylor.argmax (O(K')) is the argmax over all N ids of the dense Eq. 3 distribution."""
    rng = np.random.default_rng(7)
    n = 300
    p = rng.dirichlet(np.full(n, 0.3))
    p[[5, 17]] = p.max() * 2                       # a tie for the highest prior, possibly outside
    p /= p.sum()
    taylor = RdkTaylor(p, beta)
    for trial in range(40):
        ids = rng.choice(n, 60, replace=False)
        if dups:
            ids = np.concatenate([ids, ids[:10]])
        probs = rng.dirichlet(np.full(ids.size, 0.05 if trial % 2 else 1.0))
        if trial % 5 == 0:
            probs[:] = 1.0 / ids.size              # flat q': ties among kept ids
        kept = taylor.for_columns(ids)
        dense = kept.distribution(probs, np.empty(n))
        q = np.zeros(n)
        np.add.at(q, ids, probs)
        np.testing.assert_allclose(dense, _eq3_by_hand(q, p, beta), rtol=1e-10, atol=1e-15)
        assert kept.argmax(probs) == int(np.argmax(dense))


def test_taylor_puts_mass_outside_the_intersection_growing_with_beta():
    rng = np.random.default_rng(2)
    q, p = _tli_and_prior(rng)
    oov = q == 0
    masses = [rdk_taylor_distribution(q, p, beta)[oov].sum() for beta in (1.0, 10.0, 100.0)]
    assert 0 < masses[0] < masses[1] < masses[2]


def test_rdk_with_identity_is_tli():
    rng = np.random.default_rng(3)
    n_target = 40
    index_map = rng.choice(n_target, 16, replace=False)
    index_map[[2, 9]] = -1                                   # kept columns without a target id
    q_kept = rng.dirichlet(np.ones(16))
    q_kept[index_map < 0] = 0.0
    q_kept /= q_kept.sum()
    tli = np.zeros(n_target)
    tli[index_map[index_map >= 0]] = q_kept[index_map >= 0]
    m = Affinity.identity(index_map, n_target)
    np.testing.assert_allclose(rdk_distribution(q_kept, m), tli, rtol=0, atol=1e-15)


@pytest.mark.parametrize("dups", [False, True])
def test_rdk_strategy_with_identity_m_runs_tli(dups):
    """What calibrate writes when its shrink picks w = 1: the strategy skips M^T q' (TLI's code), and
    its distribution and greedy draft equal the general sparse path's; one off-diagonal entry or a
    weight below 1 sends it back to the general path."""
    from types import SimpleNamespace

    from edgespec.runtime.samplers import rdk as R

    from edgespec.runtime.samplers import tli as S

    rng = np.random.default_rng(5)
    v, k = 300, 90
    index_map = rng.choice(v, k, replace=False)
    index_map[[4, 50]] = -1
    if dups:
        index_map[[10, 11]] = index_map[12]
    m = Affinity.identity(index_map, v)
    bundle = SimpleNamespace(index_map=index_map, target=SimpleNamespace(vocab_size=v), affinity=m)
    state = R.prepare_rdk(bundle, {})
    assert state.identity
    general = R._RdkState(state.cols, affinity=m, tol=0.0, q_kept=np.zeros(k), out=np.empty(v))
    for t in range(20):
        logits = (rng.normal(size=k) * (1 + t % 4)).astype(np.float32)
        q = R.rdk_strategy_distribution(state, logits, S.SamplingParams(temperature=0.8), np.full(v, np.nan))
        want = R.rdk_strategy_distribution(general, logits, S.SamplingParams(temperature=0.8), np.empty(v))
        np.testing.assert_allclose(q, want, rtol=1e-12, atol=1e-15)
        assert R.rdk_greedy(state, logits) == R.rdk_greedy(general, logits)
    for data in (np.where(np.arange(m.data.size) == 3, 0.9995, 1.0), m.data):
        indices = m.indices.copy()
        if data is m.data:
            indices[7] = (indices[7] + 1) % v                    # one entry off the diagonal
        bundle.affinity = Affinity.from_csr(data, indices, m.indptr, m.shape)
        assert not R.prepare_rdk(bundle, {}).identity


def _random_affinity(rng, k, v, max_row):
    lengths = rng.integers(1, max_row + 1, k)
    indptr = np.concatenate([[0], np.cumsum(lengths)])
    indices = np.concatenate([rng.choice(v, n, replace=False) for n in lengths]).astype(np.int32)
    data = np.concatenate([rng.dirichlet(np.ones(n)) for n in lengths]).astype(np.float32)
    dense = np.zeros((k, v))
    for r in range(k):
        dense[r, indices[indptr[r]:indptr[r + 1]]] = data[indptr[r]:indptr[r + 1]]
    return Affinity.from_csr(data, indices, indptr, np.array([k, v])), dense


@pytest.mark.parametrize("padded", [True, False])
def test_rdk_equals_dense_mt_q(padded):
    rng = np.random.default_rng(4)
    m, dense = _random_affinity(rng, 30, 70, 6)
    assert m.padded_data is not None
    if not padded:
        m.padded_data = m.padded_indices = None               # the plain CSR path
    q = rng.dirichlet(np.full(30, 0.2))
    want = dense.T @ q
    np.testing.assert_allclose(rdk_distribution(q, m), want / want.sum(), rtol=1e-6, atol=1e-9)


def test_rdk_tolerance_bounds_the_l1_error():
    rng = np.random.default_rng(5)
    m, _ = _random_affinity(rng, 200, 300, 8)
    q = rng.dirichlet(np.full(200, 0.05))
    exact = rdk_distribution(q, m)
    for tol in (1e-6, 1e-3, 1e-1):
        approx = rdk_distribution(q, m, tol=tol)
        assert abs(approx.sum() - 1) < 1e-12
        assert np.abs(approx - exact).sum() <= 2 * tol + 1e-12


def test_affinity_validation():
    ok = dict(data=np.array([0.5, 0.5, 1.0]), indices=np.array([0, 2, 1]), indptr=np.array([0, 2, 3]), shape=(2, 3))
    Affinity.from_csr(**ok)
    with pytest.raises(BundleError, match="stochastic"):
        Affinity.from_csr(**{**ok, "data": np.array([0.5, 0.4, 1.0])})
    with pytest.raises(BundleError, match="out of range"):
        Affinity.from_csr(**{**ok, "indices": np.array([0, 3, 1])})
    with pytest.raises(BundleError, match="inconsistent"):
        Affinity.from_csr(**{**ok, "indptr": np.array([0, 2])})
    with pytest.raises(BundleError, match="columns"):
        rdk_distribution(np.ones(3) / 3, Affinity.from_csr(**ok))


# --------------------------------------------------------------------------- through the decode loop

from distribution import ALPHA, check_lossless  # noqa: E402  (tests/ is on sys.path)
from edgespec.errors import GenerationError  # noqa: E402
from edgespec.runtime import Bundle, SpeculativeDecoder  # noqa: E402

PROMPTS = ["def quicksort(items):", "The quick brown fox"]


def bundle_with_priors(path, seed=0, extra=3):
    """The bundle plus an in-memory prior (Dirichlet) and M (identity entry + `extra` random columns
    per kept row, random weights): RDK then moves real mass off the drafter's own tokens."""
    rng = np.random.default_rng(seed)
    b = Bundle.load(path, verify="none")
    v, k = b.target.vocab_size, b.kept
    b.prior = rng.dirichlet(np.ones(v)).astype(np.float32)
    cols = [[int(t)] * int(t >= 0) + list(rng.choice(v, extra, replace=False)) for t in b.index_map]
    data = np.concatenate([rng.dirichlet(np.ones(len(c))) for c in cols]).astype(np.float32)
    b.affinity = Affinity.from_csr(data, np.concatenate(cols).astype(np.int32),
                                   np.concatenate([[0], np.cumsum([len(c) for c in cols])]).astype(np.int64), (k, v))
    return b


@pytest.mark.parametrize("which", ["same", "self", "hetero"])
def test_greedy_output_equals_ar(request, which):
    b = bundle_with_priors(request.getfixturevalue(f"tiny_{which}_bundle"))
    ar = SpeculativeDecoder(b, strategy="ar", threads=1)
    refs = [ar.generate(p, max_new_tokens=24).token_ids for p in PROMPTS]
    for strategy, opts, gamma in [("rdk-taylor", {}, 1), ("rdk-taylor", {"rdk_beta": 1e4}, 4), ("rdk", {}, 1),
                                  ("rdk", {"rdk_tol": 0.0}, 4)]:
        dec = SpeculativeDecoder(b, strategy=strategy, draft_length=gamma, threads=1, options=opts)
        for p, ref in zip(PROMPTS, refs):
            assert dec.generate(p, max_new_tokens=24).token_ids == ref, (strategy, opts, gamma, p)


def test_rdk_drafts_tokens_outside_the_drafter_head(tiny_same_bundle, monkeypatch):
    """The point of RDK: with M sending mass to target ids the pruned head lacks, such ids get drafted
    and fed to the drafter (same tokenizer: through its full input embedding)."""
    from edgespec.runtime.round import context
    b = bundle_with_priors(tiny_same_bundle, extra=6)
    outside = set(range(b.target.vocab_size)) - set(b.index_map.tolist())
    fed = []
    monkeypatch.setattr(context.SameContext, "feed_ids", lambda self, t: fed.append(t) or [t])
    dec = SpeculativeDecoder(b, strategy="rdk", draft_length=4, threads=1)
    for seed in range(5):
        dec.generate(PROMPTS[0], max_new_tokens=12, temperature=1.0, seed=seed)
    assert set(fed) & outside


@pytest.mark.parametrize("strategy,opts,which", [("rdk-taylor", {"rdk_beta": 3e4}, "self"),
                                                 ("rdk", {}, "same")])
def test_samples_the_target_distribution(request, strategy, opts, which):
    b = bundle_with_priors(request.getfixturevalue(f"tiny_{which}_bundle"))
    dec = SpeculativeDecoder(b, strategy=strategy, draft_length=4, threads=1, options=opts)
    pvals = check_lossless(dec, b, b.target.tokenizer.encode("The quick brown").ids, n=2000, seed=0)
    assert min(pvals.values()) > ALPHA, pvals


def test_bundles_without_priors_are_refused(tiny_same_bundle):
    b = Bundle.load(tiny_same_bundle)
    with pytest.raises(GenerationError, match="prior"):
        SpeculativeDecoder(b, strategy="rdk-taylor")
    with pytest.raises(GenerationError, match="affinity matrix M"):
        SpeculativeDecoder(b, strategy="rdk")
    b = bundle_with_priors(tiny_same_bundle)
    with pytest.raises(GenerationError, match="rdk_tol"):
        SpeculativeDecoder(b, strategy="rdk", options={"rdk_tol": 1.5})


@pytest.mark.real
def test_smollm_self_greedy_equals_ar(smollm_self_bundle):
    b = Bundle.load(smollm_self_bundle, verify="none")
    counts = np.bincount(b.target.tokenizer.encode(Path(np.__file__).read_text()).ids, minlength=b.target.vocab_size)
    b.prior = ((counts + 0.5) / (counts + 0.5).sum()).astype(np.float32)
    b.affinity = bundle_with_priors(smollm_self_bundle, extra=7).affinity
    prompts = ["def fibonacci(n):", "The capital of France is"]
    ar = SpeculativeDecoder(b, strategy="ar", threads=1)
    refs = [ar.generate(p, max_new_tokens=24).token_ids for p in prompts]
    for strategy in ("rdk-taylor", "rdk"):
        dec = SpeculativeDecoder(b, strategy=strategy, draft_length=4, threads=1)
        assert [dec.generate(p, max_new_tokens=24).token_ids for p in prompts] == refs, strategy


def test_runtime_makes_no_blas_calls():
    """np.dot/matmul/@ go to OpenBLAS, whose worker threads sleep during every ORT forward and must wake
    up for the next call: measured 4-6 ms per rdk-taylor step in a bench (0.1 ms with einsum), plus CPU
    stolen from ORT. The decode path is vector work, so the runtime uses none of them."""
    import ast

    runtime = Path(__file__).resolve().parents[1] / "runtime"
    blas = {"dot", "matmul", "inner", "vdot", "tensordot"}
    found = []
    for path in sorted(runtime.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.BinOp) and isinstance(node.op, ast.MatMult):
                found.append(f"{path.name}:{node.lineno} @")
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in blas):
                found.append(f"{path.name}:{node.lineno} {node.func.attr}")
    assert len(list(runtime.rglob("*.py"))) > 10
    assert not found, found


@pytest.mark.parametrize("dups", [False, True])
def test_tli_adds_up_columns_that_share_a_target_id(dups):
    """TLI's scatter (bincount over the distinct ids) equals the literal sum over columns."""
    from types import SimpleNamespace

    from edgespec.runtime.samplers import tli as S

    rng = np.random.default_rng(11)
    index_map = rng.choice(500, 120, replace=False)
    index_map[[3, 40]] = -1
    if dups:
        index_map[[7, 8, 90]] = index_map[5]                    # e.g. byte-fallback and normal tokens
    cols = S.kept_columns(SimpleNamespace(index_map=index_map, target=SimpleNamespace(vocab_size=500)))
    assert cols.unique is not dups
    logits = rng.normal(size=120).astype(np.float32)
    q = S.tli_distribution(cols, logits, S.SamplingParams(temperature=0.7), np.full(500, np.nan))
    x = np.exp(logits[index_map >= 0].astype(np.float64) / 0.7)
    want = np.zeros(500)
    for tid, w in zip(index_map[index_map >= 0], x / x.sum()):
        want[tid] += w
    np.testing.assert_allclose(q, want, rtol=1e-6, atol=1e-15)       # the drafter softmax is float32
