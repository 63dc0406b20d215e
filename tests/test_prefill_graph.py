"""The target's prefill graph (export/prefill_graph.py, runtime/engine/kv.py): written for int8-compute
graphs, run for long forwards only, greedy speculation still identical to greedy `ar`, and one-line
errors where it is missing or cannot run. Tiny int4 bundle from the tiny fixtures' export cache."""
import json
from pathlib import Path

import numpy as np
import onnx
import pytest

from edgespec.errors import BundleError, GenerationError
from edgespec.export.prefill_graph import PREFILL_GRAPH
from edgespec.runtime import Bundle, SpeculativeDecoder
from edgespec.runtime.api.checks import MAX_DRAFT_LENGTH
from edgespec.runtime.engine.kv import PREFILL_GRAPH_TOKENS, ModelRunner
from edgespec.runtime.engine.sessions import create_session

LONG = "def quicksort(items):\n    if len(items) <= 1:\n        return items\n" * 12
SHORT = "The quick brown fox"


@pytest.fixture(scope="module")
def int4_bundle(tiny_int4_bundle) -> Path:
    return tiny_int4_bundle


def _levels(path: Path) -> list[int]:
    g = onnx.load(str(path), load_external_data=False).graph
    return [a.i for n in g.node if n.op_type == "MatMulNBits" for a in n.attribute if a.name == "accuracy_level"]


def test_export_writes_a_listed_fp32_compute_twin(int4_bundle):
    target = int4_bundle / "target"
    assert set(_levels(target / "model.onnx")) == {4} and set(_levels(target / PREFILL_GRAPH)) == {1}
    assert len(_levels(target / PREFILL_GRAPH)) == len(_levels(target / "model.onnx"))
    man = json.loads((int4_bundle / "manifest.json").read_text())
    assert "target/prefill.onnx" in man["files"] and not (int4_bundle / "drafter" / PREFILL_GRAPH).exists()
    assert Bundle.load(int4_bundle, verify="full").target.prefill_onnx == target / PREFILL_GRAPH


def test_a_float_bundle_has_none_and_the_option_says_so(tiny_same_bundle):
    b = Bundle.load(tiny_same_bundle)
    assert b.target.prefill_onnx is None
    with pytest.raises(GenerationError, match="has no prefill graph.*re-export") as e:
        SpeculativeDecoder(b, prefill_graph=True, threads=1)
    assert "\n" not in str(e.value)


def test_an_unlisted_prefill_graph_is_refused(int4_bundle, copy_bundle):
    b = copy_bundle(int4_bundle)
    man = json.loads((b / "manifest.json").read_text())
    del man["files"]["target/prefill.onnx"]
    (b / "manifest.json").write_text(json.dumps(man))
    with pytest.raises(BundleError, match="prefill"):
        Bundle.load(b, verify="none")


def test_a_listed_but_missing_prefill_graph_is_refused(int4_bundle, copy_bundle):
    b = copy_bundle(int4_bundle)
    (b / "target" / PREFILL_GRAPH).unlink()
    with pytest.raises(BundleError, match="missing file target/prefill.onnx"):
        Bundle.load(b, verify="none")


def test_the_option_is_for_the_cpu_ep_and_a_flag(int4_bundle):
    with pytest.raises(GenerationError, match="CPU EP"):
        SpeculativeDecoder(int4_bundle, prefill_graph=True, ep="cuda", threads=1)
    with pytest.raises(GenerationError, match="prefill_graph must be 'auto', True or False"):
        SpeculativeDecoder(int4_bundle, prefill_graph="no", threads=1)


def test_verify_forwards_never_reach_the_prefill_graph():
    assert MAX_DRAFT_LENGTH + 1 < PREFILL_GRAPH_TOKENS


def test_the_export_checked_it(int4_bundle):
    diff = json.loads((int4_bundle / "manifest.json").read_text())["checks"]["prefill_graph_vs_graph_max_abs_diff"]
    assert diff is not None and 0 <= diff < 1.0


@pytest.mark.parametrize("kv", ["auto", "copy"])
def test_long_forwards_run_on_the_prefill_graph_and_short_ones_do_not(int4_bundle, kv):
    b = Bundle.load(int4_bundle)
    ids = b.target.tokenizer.encode(LONG).ids
    assert len(ids) >= PREFILL_GRAPH_TOKENS

    def runner(path, prefill=None):
        return ModelRunner(create_session(path, "cpu", threads=1)[0], "target", kv=kv, prefill_session=prefill)

    main, twin = runner(b.target.onnx), runner(b.target.prefill_onnx)
    both = runner(b.target.onnx, create_session(b.target.prefill_onnx, "cpu", threads=1)[0])
    long_both, long_twin, long_main = (r.forward(ids, last=1)[-1].copy() for r in (both, twin, main))
    assert np.array_equal(long_both, long_twin) and not np.array_equal(long_both, long_main)
    # the long forward wrote the KV the main graph then reads: a 3-token step after it equals the step
    # of a copy-layout runner, whose KV travels as inputs (so it cannot read other buffers)
    assert all(np.array_equal(a, t) for a, t in zip(both.cached_kv(), twin.cached_kv()))
    copy = ModelRunner(create_session(b.target.onnx, "cpu", threads=1)[0], "target", kv="copy",
                       prefill_session=create_session(b.target.prefill_onnx, "cpu", threads=1)[0])
    copy.forward(ids, last=1)
    step = ids[5:8]
    assert np.allclose(both.forward(step)[-1], copy.forward(step)[-1], atol=1e-4)
    for r in (both, twin, main):        # then a 3-token step after each one's own short prefill
        r.reset()
        r.forward(ids[:20])
    step_both, step_main = both.forward(ids[20:23])[-1], main.forward(ids[20:23])[-1]
    assert np.array_equal(step_both, step_main)


@pytest.mark.parametrize("strategy,gamma", [("tli", 2), ("auto", "auto")])
def test_greedy_speculation_equals_ar_with_the_prefill_graph(int4_bundle, strategy, gamma):
    """Cold calls (prefix_reuse=False); reused ones: the next test."""
    b = Bundle.load(int4_bundle)
    dec = SpeculativeDecoder(b, strategy=strategy, draft_length=gamma, threads=1, prefill_graph=True,
                             options={"prefix_reuse": False})
    ar = dec.variant("ar")
    for prompt in (LONG, SHORT):
        expect = ar.generate(prompt, max_new_tokens=24).token_ids
        assert len(expect) > 0
        assert dec.generate(prompt, max_new_tokens=24).token_ids == expect, prompt[:20]


def test_generate_cli_takes_the_flag(int4_bundle, tiny_same_bundle, capsys):
    from edgespec.cli import main

    args = ["generate", "--bundle", str(int4_bundle), "--prompt", LONG, "--max-new-tokens", "8", "--threads", "1",
            "--prefill-graph", "on", "--json"]
    assert main(args) == 0
    out = json.loads(capsys.readouterr().out)
    ref = SpeculativeDecoder(int4_bundle, strategy="ar", threads=1, prefill_graph=True).generate(LONG, max_new_tokens=8)
    assert out["token_ids"] == ref.token_ids
    assert main(["generate", "--bundle", str(tiny_same_bundle), "--prompt", "x", "--prefill-graph", "on"]) == 2
    err = capsys.readouterr().err
    assert "has no prefill graph" in err and "--prefill-graph" in err and err.count("\n") == 1


def test_sampling_with_the_prefill_graph_keeps_the_target_distribution(int4_bundle, monkeypatch):
    """The prompt's KV from the prefill graph, every later token from the graph: `tli` at T=1 samples
    the distribution of that target (tests/distribution.py, its oracle prefilling the same way), and a
    verifier without the residual fails the same test."""
    from distribution import ALPHA, check_lossless, sample_tokens  # tests/ is on sys.path (conftest.py)
    from edgespec.runtime.round import rounds as rounds_module
    from edgespec.runtime.samplers.sampling import SamplingParams
    from distribution import REJECTION, verify_without_residual

    b = Bundle.load(int4_bundle)
    ids = b.target.tokenizer.encode(LONG).ids
    dec = SpeculativeDecoder(b, strategy="tli", draft_length=4, threads=1, prefill_graph=True,
                             options={"prefix_reuse": False, **REJECTION})
    dec.generate(ids, max_new_tokens=2, temperature=1.0, seed=0)
    assert dec.last_result.stats.prefill_ms > 0 and dec.target.prefill_session is not None
    pvals = check_lossless(dec, b, ids, n=1500, seed=0, prefill_graph=True)
    assert set(pvals) == {"x1", "x2", "x3|x1x2"} and min(pvals.values()) > ALPHA, pvals
    monkeypatch.setattr(rounds_module, "verify_sampled", verify_without_residual)
    broken = sample_tokens(dec, ids, 1500, 0, SamplingParams(temperature=1.0))
    pvals = check_lossless(dec, b, ids, samples=broken, prefill_graph=True)
    assert min(pvals.values()) < ALPHA, pvals       # the test above fails it (here at x3 given x1 x2)


def _prompt_kv(dec, n):
    return [h[:, :, :n].copy() for h in dec.target.cached_kv()]


@pytest.mark.parametrize("kv_chunks", [(0.5, 40), (0.9, 3)])
def test_a_reused_prefix_gives_the_cold_calls_kv_bit_for_bit(int4_bundle, kv_chunks):
    """Prefix reuse with the prefill graph (runtime/engine/prefix.py): a call that extends the previous
    prompt + answer keeps only the previous prompt's KV (the answer's came from the graph) and prefills
    the rest on the prefill graph; the prompt's KV then equals a cold call's, bit for bit, and so do
    the tokens. A shorter prompt keeps nothing the prefill graph computed."""
    share, extra = kv_chunks
    b = Bundle.load(int4_bundle)
    ids = b.target.tokenizer.encode(LONG).ids
    warm = SpeculativeDecoder(b, strategy="tli", draft_length=2, threads=1, prefill_graph=True)
    cold = warm.variant(prefix_reuse=False)
    first = warm.generate(ids[:int(len(ids) * share)] if share < 1 else ids, max_new_tokens=8)
    p1 = first.prompt_token_ids
    assert len(p1) >= PREFILL_GRAPH_TOKENS and warm.target.prefill_graph_rows == len(p1)
    second_ids = p1 + first.token_ids + ids[:extra]
    second = warm.generate(second_ids, max_new_tokens=8)
    assert second.stats.reused_tokens == len(p1)          # the prompt, not the answer
    kv_warm = _prompt_kv(warm, len(second_ids))
    again = warm.generate(second_ids, max_new_tokens=8)       # the same prompt again: the last 2 tokens re-run
    assert again.stats.reused_tokens == len(second_ids) - 2
    expect = cold.generate(second_ids, max_new_tokens=8)
    assert all(np.array_equal(w, c) for w, c in zip(kv_warm, _prompt_kv(cold, len(second_ids))))
    assert second.token_ids == expect.token_ids == again.token_ids
    warm.generate(second_ids, max_new_tokens=8)
    short = warm.generate(second_ids[:PREFILL_GRAPH_TOKENS - 10], max_new_tokens=4)
    assert short.stats.reused_tokens == 0


def test_where_the_prefill_graph_is_not_chunk_invariant_long_prompts_are_not_reused(int4_bundle, monkeypatch,
                                                                                   tmp_path):
    """The decoder probes the prefill graph where it builds it (kv.ModelRunner.check_prefill_chunks);
    where one forward and two halves differ, it says so once and a long prompt starts cold."""
    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path))        # no verdict remembered from other tests
    b = Bundle.load(int4_bundle)
    assert SpeculativeDecoder(b, strategy="ar", threads=1, prefill_graph=True).target.prefill_chunks_exact
    assert not SpeculativeDecoder(b, strategy="ar", threads=1, prefill_graph=False).target.prefill_chunks_exact

    def differs(self, tokens=16):
        return False
    monkeypatch.setattr(ModelRunner, "probe_prefill_chunks", differs)
    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path / "other"))   # nor the verdict of the decoder above
    with pytest.warns(RuntimeWarning, match="not chunk-invariant"):
        dec = SpeculativeDecoder(b, strategy="tli", draft_length=2, threads=1, prefill_graph=True)
    ids = b.target.tokenizer.encode(LONG).ids
    first = dec.generate(ids, max_new_tokens=4)
    second = dec.generate(first.prompt_token_ids + first.token_ids + ids[:10], max_new_tokens=4)
    assert second.stats.reused_tokens == 0


@pytest.fixture
def auto_from_150(monkeypatch):
    """prefill_graph="auto" from 150 tokens (the tiny models hold 512 positions, the real threshold)."""
    from edgespec.runtime.engine import sessions
    monkeypatch.setattr(sessions, "AUTO_PREFILL_GRAPH_TOKENS", 150)


def test_auto_is_the_default_and_builds_the_prefill_graph_for_its_first_long_prompt(int4_bundle, auto_from_150):
    b = Bundle.load(int4_bundle)
    ids = b.target.tokenizer.encode(LONG).ids
    assert len(ids) >= 150 > 120 >= PREFILL_GRAPH_TOKENS
    dec = SpeculativeDecoder(b, strategy="tli", draft_length=2, threads=1)
    plain = SpeculativeDecoder(b, strategy="tli", draft_length=2, threads=1, prefill_graph=False)
    assert dec.target.prefill_pending and dec.target.prefill_session is None
    medium = dec.generate(ids[:120], max_new_tokens=8)          # under the threshold: the graph, no build
    assert dec.target.prefill_pending and medium.stats.prefill_graph_load_ms == 0
    assert medium.token_ids == plain.generate(ids[:120], max_new_tokens=8).token_ids
    long = dec.generate(ids, max_new_tokens=8)
    assert not dec.target.prefill_pending and long.stats.prefill_graph_load_ms > 0
    assert dec.target.prefill_graph_rows == len(ids) and dec.target.prefill_chunks_exact
    assert long.stats.ttft_ms >= long.stats.prefill_graph_load_ms     # its build is time to the first token
    on = SpeculativeDecoder(b, strategy="tli", draft_length=2, threads=1, prefill_graph=True,
                            options={"prefix_reuse": False})
    assert long.token_ids == on.generate(ids, max_new_tokens=8).token_ids == \
        dec.variant("ar", prefix_reuse=False).generate(ids, max_new_tokens=8).token_ids
    again = dec.generate(ids, max_new_tokens=8)
    assert again.stats.prefill_graph_load_ms == 0 and again.token_ids == long.token_ids
    # one threshold, built or not: the medium prompt still runs on the graph, with the same tokens
    assert dec.variant(prefix_reuse=False).generate(ids[:120], max_new_tokens=8).token_ids == medium.token_ids
    assert dec.target.prefill_graph_rows == 0


def test_auto_builds_it_up_front_where_the_drafter_is_and_skips_bundles_without_one(int4_bundle, tiny_same_bundle,
                                                                                    auto_from_150):
    dec = SpeculativeDecoder(int4_bundle, strategy="tli", draft_length=2, threads=1,
                             options={"defer_drafter": False})
    assert not dec.target.prefill_pending and dec.target.prefill_session is not None
    assert dec.target.prefill_chunks_exact and dec.target.prefill_from == 150
    assert SpeculativeDecoder(int4_bundle, threads=1, prefill_graph=True).target.prefill_from == PREFILL_GRAPH_TOKENS
    plain = SpeculativeDecoder(tiny_same_bundle, threads=1)    # no prefill graph: auto is off, not an error
    assert not plain.target.prefill_pending and not plain.target.prefill_graph_for(10_000)


def test_a_prefill_graph_that_cannot_be_built_is_said_once_and_long_prompts_run_on_the_graph(
        int4_bundle, copy_bundle, auto_from_150):
    b = copy_bundle(int4_bundle)
    dec = SpeculativeDecoder(Bundle.load(b), strategy="ar", threads=1)
    (b / "target" / PREFILL_GRAPH).write_bytes(b"not an onnx graph")      # damaged after the load
    ids = dec.bundle.target.tokenizer.encode(LONG).ids
    with pytest.warns(RuntimeWarning, match="prefill graph could not be built") as seen:
        first = dec.generate(ids, max_new_tokens=6)
    assert len(seen) == 1 and "\n" not in str(seen[0].message)
    assert not dec.target.prefill_pending and not dec.target.prefill_graph_for(len(ids))
    expect = SpeculativeDecoder(int4_bundle, strategy="ar", threads=1, prefill_graph=False).generate(ids, max_new_tokens=6)
    assert first.token_ids == expect.token_ids == dec.generate(ids, max_new_tokens=6).token_ids


def test_the_chunk_check_runs_once_per_machine_and_again_where_the_machine_differs(int4_bundle, tmp_path,
                                                                                  monkeypatch):
    """runtime/engine/verdicts.py: the verdict is kept beside the prefill graph's digest under the ORT version,
    the CPU and the thread count; a later decoder that builds the graph does not probe again."""
    from edgespec.runtime.engine import verdicts

    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path / "home"))
    probes = []
    real = ModelRunner.probe_prefill_chunks

    def counted(self, tokens=16):
        probes.append(tokens)
        return real(self, tokens)
    monkeypatch.setattr(ModelRunner, "probe_prefill_chunks", counted)
    first = SpeculativeDecoder(int4_bundle, strategy="ar", threads=1, prefill_graph=True)
    again = SpeculativeDecoder(int4_bundle, strategy="ar", threads=1, prefill_graph=True)
    assert len(probes) == 1 and first.target.prefill_chunks_exact and again.target.prefill_chunks_exact
    SpeculativeDecoder(int4_bundle, strategy="ar", threads=2, prefill_graph=True)        # another thread count
    monkeypatch.setattr(verdicts, "cpu_signature", lambda: "another-cpu")
    SpeculativeDecoder(int4_bundle, strategy="ar", threads=1, prefill_graph=True)
    assert len(probes) == 3
    (tmp_path / "home" / "digests.json").write_text("{not json")                  # a damaged record: probe
    assert SpeculativeDecoder(int4_bundle, strategy="ar", threads=1, prefill_graph=True).target.prefill_chunks_exact
    assert len(probes) == 4
