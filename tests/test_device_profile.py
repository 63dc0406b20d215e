"""The device profile (runtime/planning/device_profile.py) measured on the tiny builder int4 pair, its cache, and the
decoder's use of it (runtime/planning/device_plan.py): keyed by bundle, ORT, CPU and threads; a damaged one is
measured again, saying so; a plan from it decides the graph, the drafter and gamma, losslessly."""
import dataclasses
import json

import numpy as np
import pytest

from edgespec.runtime import Bundle, SpeculativeDecoder
from edgespec.runtime.planning import device_profile as dp
from edgespec.runtime.planning.device_plan import _join_running

PROMPT = "def add(a, b):\n    return a + b\n\nclass Stack:\n    def push(self, item):"


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path / "home"))
    monkeypatch.setenv(dp.MODE_ENV, "cached")
    return tmp_path / "home"


@pytest.fixture(scope="module")
def bundle(tiny_padded_bundle) -> Bundle:
    return Bundle.load(tiny_padded_bundle)


def test_measured_once_then_read(bundle, home):
    profile, measured = dp.ensure_profile(bundle, threads=1)
    assert measured and profile.key["threads"] == 1 and profile.drafter_step_ms > 0
    first = profile.graphs["padded_attention"]
    assert first.measured and len(first.cost_ms) == dp.TAIL and all(c > 0 for c in first.cost_ms)
    assert first.one_token_exact in (True, False) and first.wide_exact in (True, False)
    if not (first.one_token_exact and first.wide_exact):
        assert profile.graphs["model"].measured           # measured only where the padded graph is not exact
    again, measured = dp.ensure_profile(bundle, threads=1)
    assert not measured and again == profile
    assert dp.profile_path(profile.key).parent == home / "profiles"


def test_the_probe_sees_what_the_runtime_pads(bundle):
    """model.onnx pads 1-token steps because they differ from wider forwards (the export measured 2e-6):
    the probe, on a runner that does not pad, finds that; its 2+-token forwards agree."""
    from edgespec.runtime.engine.kv import ModelRunner
    from edgespec.runtime.engine.sessions import create_session

    runner = ModelRunner(create_session(bundle.target.onnx, "cpu", threads=1)[0], "target", exact=False)
    g = dp.probe_graph(runner, dp.probe_ids(bundle, dp.PREFIX + dp.TAIL))
    assert g.wide_exact and g.wide_max_abs_diff == 0.0
    assert g.one_token_exact is (g.one_token_max_abs_diff == 0.0)
    assert runner.length == 0


def test_another_thread_count_ort_or_bundle_is_another_profile(bundle, home, monkeypatch, tiny_self_bundle):
    profile, _ = dp.ensure_profile(bundle, threads=1)
    assert dp.load_profile(bundle, threads=2) is None
    other = Bundle.load(tiny_self_bundle)
    assert dp.profile_key(other, 1) != profile.key and dp.load_profile(other, 1) is None
    import onnxruntime as ort
    monkeypatch.setattr(ort, "__version__", "0.0.0-another")
    assert dp.load_profile(bundle, threads=1) is None
    monkeypatch.setattr(dp, "cpu_signature", lambda: "another-cpu")
    assert dp.profile_key(bundle, 1)["cpu"] == "another-cpu"


@pytest.mark.parametrize("damage", ["{not json", '{"version": 1}', "wrong-key", "negative-cost"])
def test_a_damaged_profile_is_measured_again_saying_so(bundle, home, capsys, damage):
    profile, _ = dp.ensure_profile(bundle, threads=1)
    path = dp.profile_path(profile.key)
    doc = json.loads(path.read_text())
    if damage == "wrong-key":
        doc["key"]["threads"] = 7
        path.write_text(json.dumps(doc))
    elif damage == "negative-cost":
        doc["graphs"]["padded_attention"]["cost_ms"][0] = -1
        path.write_text(json.dumps(doc))
    else:
        path.write_text(damage)
    capsys.readouterr()
    again, measured = dp.ensure_profile(bundle, threads=1)
    err = capsys.readouterr().err
    assert measured and err.count("\n") == 1 and "damaged" in err and str(path) in err
    assert dp.load_profile(bundle, threads=1) == again          # rewritten whole


def _write(profile) -> None:
    """Cache an injected profile, as measured on a quiet machine (whatever ran beside this test's own
    measurement: a profile measured beside other work is measured again, test_threads.py)."""
    assert dp.save_profile(dataclasses.replace(profile, others_busy_cores=0.0)) is not None


def test_a_plan_without_the_drafter_never_builds_it_and_equals_ar(bundle, home, monkeypatch):
    """A profile where the drafter costs as much as a target step: the default decodes plainly (prompt
    lookup), never building the drafter's session; its greedy output is ar's."""
    profile, _ = dp.ensure_profile(bundle, threads=1)
    slow = dataclasses.replace(profile, drafter_step_ms=10 * max(g.cost_ms[-1] for g in profile.graphs.values()
                                                                 if g.cost_ms))
    _write(slow)
    dec = SpeculativeDecoder(bundle, threads=1)
    assert dec.planning.plan.source == "profile" and not dec.planning.current().drafter
    want = dec.variant("ar").generate(PROMPT, max_new_tokens=30).token_ids
    res = dec.generate(PROMPT, max_new_tokens=30)
    assert res.token_ids == want and res.stats.strategy == "ngram"
    assert dec.drafter.pending                              # never built
    # alone, the target's threads keep spinning between steps, as `ar`'s do (runtime/engine/sessions.py)
    assert _spin_stops(monkeypatch, bundle) is False and _spin_stops(monkeypatch, bundle, "tli") is True


def _spin_stops(monkeypatch, bundle, strategy="auto") -> bool:
    """Whether a new decoder's target session stops its threads spinning after each run."""
    from edgespec.runtime.api import build as build_module
    made, real = [], build_module.create_sessions
    monkeypatch.setattr(build_module, "create_sessions", lambda requests, **kw: made.extend(requests) or
                        real(requests, **kw))
    SpeculativeDecoder(bundle, strategy, threads=1)
    monkeypatch.setattr(build_module, "create_sessions", real)
    return next(r["stop_spinning"] for r in made if r["role"] == "target")


def _record_limits(auto) -> dict:
    """The draft lengths the generation offers each governor of an `auto` variant (records.StepPlan
    bounds the drafter's), recorded as they are offered."""
    limits = {"drafter": [], "ngram": []}
    for source, seen in limits.items():
        governor = auto.setup.governor_for(source)
        choose = governor.choose
        governor.choose = lambda limit, choose=choose, seen=seen: seen.append(limit) or choose(limit)
    return limits


def test_a_plan_on_padded_model_steps_where_the_padded_graph_is_inexact(bundle, home):
    """The EPYC case, injected: padded-attention graph inexact here: model.onnx with padded steps, exact."""
    profile, _ = dp.ensure_profile(bundle, threads=1)
    bad = dp.GraphProfile(measured=True, one_token_exact=False, wide_exact=False, one_token_max_abs_diff=0.58,
                          wide_max_abs_diff=0.58, cost_ms=profile.graphs["padded_attention"].cost_ms)
    model = dp.GraphProfile(measured=True, one_token_exact=False, wide_exact=True, one_token_max_abs_diff=2e-6,
                            wide_max_abs_diff=0.0, cost_ms=[1.0, 1.2, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0])
    _write(dataclasses.replace(profile, graphs={"padded_attention": bad, "model": model}, drafter_step_ms=0.1))
    dec = SpeculativeDecoder(bundle, threads=1)
    plan = dec.planning.plan
    assert plan.step_graph == "model" and plan.step_tokens == 2 and plan.drafter
    assert dec.target.min_tokens == 2 and dec.target.pad_rows == 0
    auto = dec._resolved(plan, True)                                  # before any acceptance is measured
    assert auto.strategy.name == "ngram-tli" and plan.gamma_max < 8
    limits = _record_limits(auto)
    dec.generate(PROMPT + " " + PROMPT, max_new_tokens=30)
    assert 0 < max(limits["drafter"]) <= plan.gamma_max                # the plan bounds the drafter's rounds
    assert max(limits["ngram"], default=8) > plan.gamma_max           # lookup keeps its range
    ar, ar_fast = dec.variant("ar"), dec.variant("ar", plain_steps="fast")
    for prompt in (PROMPT, "The quick brown fox"):             # the measured acceptance may drop the drafter
        res = dec.generate(prompt, max_new_tokens=30)
        plain = res.stats.strategy == "ar"                    # then unpadded 1-token steps: ar-fast
        want = (ar_fast if plain else ar).generate(prompt, max_new_tokens=30).token_ids
        assert res.token_ids == want and res.stats.strategy in ("ngram-tli", "ngram", "ar")
        filled = res.stats.draft_prefill_ms if res.stats.draft_forwards else 0.0
    assert dec.planning.fill_ms >= filled and (dec.planning.drafted_tokens > 0) == (dec.planning.fill_ms > 0)


def test_without_the_drafter_unpadded_steps_where_padding_costs_more_than_lookup_saves(bundle, home):
    """1-token forwards differ from wider ones here and cost 0.5x a padded step; the drafter never pays:
    the default runs `ar` with 1-token steps (the target's own decoding, ar-fast's tokens). Once the
    outputs show lookup guesses kept more often than a padded step's extra cost, it pads and guesses."""
    profile, _ = dp.ensure_profile(bundle, threads=1)
    model = dp.GraphProfile(measured=True, one_token_exact=False, wide_exact=True, one_token_max_abs_diff=2e-6,
                            wide_max_abs_diff=0.0, cost_ms=[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0])
    _write(dataclasses.replace(profile, graphs={"model": model}, drafter_step_ms=100.0))
    dec = SpeculativeDecoder(bundle, threads=1)
    assert dec.planning.plan.step_tokens == 2 and dec.planning.current().plain_steps == "fast"
    fast = dec.variant("ar", plain_steps="fast")
    for prompt in (PROMPT, "The quick brown fox jumps over"):
        res = dec.generate(prompt, max_new_tokens=40)
        assert res.stats.strategy == "ar" and res.stats.guesses == 0
        # the KV of unpadded steps is not a cold prefill's: the next call reuses the prompt's positions only
        assert dec.shared.prefix.target_ids == res.prompt_token_ids
        assert res.token_ids == fast.generate(prompt, max_new_tokens=40).token_ids
    # ... and does reuse them: the same prompt again keeps all but its last token, with a cold call's output
    cold = dec.variant("ar", plain_steps="fast", prefix_reuse=False).generate(PROMPT, max_new_tokens=40)
    assert dec.generate(PROMPT, max_new_tokens=40).stats.reused_tokens == 0          # the cold call kept nothing
    again = dec.generate(PROMPT, max_new_tokens=40)
    assert again.stats.strategy == "ar" and again.stats.reused_tokens == len(again.prompt_token_ids) - 1
    assert again.token_ids == cold.token_ids
    turn = dec.generate(PROMPT + again.text + " and then", max_new_tokens=8)           # a chat's next turn
    assert turn.stats.reused_tokens >= len(again.prompt_token_ids) - 1
    assert dec.planning.guess_steps >= 70 and dec.drafter.pending                     # outputs booked
    dec.planning.guesses_kept = dec.planning.guess_steps                              # as if all were copied
    assert dec.planning.current().plain_steps == "exact"
    res = dec.generate(PROMPT, max_new_tokens=20)
    assert res.stats.strategy == "ngram" and res.stats.guesses + res.stats.drafted > 0    # padded, lookup
    assert res.token_ids == dec.variant("ar").generate(PROMPT, max_new_tokens=20).token_ids


def test_measured_after_the_first_generation_not_before(bundle, home, monkeypatch):
    monkeypatch.setenv(dp.MODE_ENV, "auto")
    chosen = SpeculativeDecoder(bundle, strategy="tli", threads=1)      # a chosen strategy: the plan is auto's
    chosen.generate(PROMPT, max_new_tokens=4)
    assert chosen.planning.measuring is None and dp.load_profile(bundle, threads=1) is None
    dec = SpeculativeDecoder(bundle, threads=1)
    assert dec.planning.profile is None and dec.planning.plan.source == "export"
    first = dec.generate(PROMPT, max_new_tokens=12)
    assert dec.planning.measuring is not None
    _join_running()
    assert dec.planning.profile is not None and dp.load_profile(bundle, threads=1) == dec.planning.profile
    assert dec.generate(PROMPT, max_new_tokens=12).token_ids == first.token_ids
    assert SpeculativeDecoder(bundle, threads=1).planning.plan.source == "profile"


def test_a_profile_measured_on_a_busy_cpu_is_measured_again_once(bundle, home, monkeypatch, capsys):
    """A cached profile 5x slower than this machine's forwards (as one measured while other jobs ran): the
    decoder's own timed forwards give it away, and it is measured again, once, with one line."""
    from edgespec.runtime.planning.device_plan import LIVE_SAMPLES
    monkeypatch.setenv(dp.MODE_ENV, "auto")
    profile, _ = dp.ensure_profile(bundle, threads=1)
    busy = {name: dataclasses.replace(g, cost_ms=[5 * c for c in g.cost_ms]) for name, g in profile.graphs.items()}
    _write(dataclasses.replace(profile, graphs=busy, drafter_step_ms=5 * profile.drafter_step_ms))
    dec = SpeculativeDecoder(bundle, threads=1)
    ar = dec.variant("ar")
    assert dec.planning.live_ratio() is None                      # nothing timed yet
    want = ar.generate(PROMPT, max_new_tokens=LIVE_SAMPLES + 8).token_ids   # 1-token steps, timed
    assert dec.planning.live_ratio() < 0.7
    _join_running()
    assert dec.planning.remeasured
    again = dp.load_profile(bundle, threads=1)
    assert again.graphs["padded_attention"].cost_ms[0] < busy["padded_attention"].cost_ms[0] / 2
    assert dec.planning.profile == again
    err = [line for line in capsys.readouterr().err.splitlines() if "faster than it says" in line]
    assert len(err) == 1 and err[0].startswith("edgespec: the device profile is measured again: this machine's")
    assert dec.generate(PROMPT, max_new_tokens=LIVE_SAMPLES + 8).token_ids == want
    _join_running()
    assert capsys.readouterr().err.count("faster than it says") == 0     # once per decoder


def test_bench_reports_a_profile_measured_again(bundle, home, monkeypatch, tmp_path):
    """bench plans from the stale profile it finds, and its report carries the one measured again."""
    from edgespec.cli import main
    monkeypatch.setenv(dp.MODE_ENV, "auto")
    profile, _ = dp.ensure_profile(bundle, threads=1)
    busy = {name: dataclasses.replace(g, cost_ms=[5 * c for c in g.cost_ms]) for name, g in profile.graphs.items()}
    _write(dataclasses.replace(profile, graphs=busy))
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"question_id": "q0", "category": "code", "turns": [PROMPT]}) + "\n")
    out = tmp_path / "r"
    assert main(["bench", "--bundle", str(bundle.path), "--prompts", str(prompts), "--strategies", "ar,auto",
                 "--max-new-tokens", "40", "--repeats", "1", "--threads", "1", "--bandwidth-mb", "0", "--quiet",
                 "--report", str(out)]) == 0
    device = json.loads((out / "report.json").read_text())["device_plan"]
    assert device["profile"]["graphs"]["padded_attention"]["cost_ms"] == busy["padded_attention"].cost_ms
    again = device["profile_measured_again"]
    assert again["graphs"]["padded_attention"]["cost_ms"][0] < busy["padded_attention"].cost_ms[0] / 2


def test_a_profile_slower_than_live_forwards_is_kept(bundle, home, monkeypatch):
    """Forwards slower than the profile (a machine busy now, or longer contexts) never re-measure it."""
    monkeypatch.setenv(dp.MODE_ENV, "auto")
    profile, _ = dp.ensure_profile(bundle, threads=1)
    quick = {name: dataclasses.replace(g, cost_ms=[c / 5 for c in g.cost_ms]) for name, g in profile.graphs.items()}
    _write(dataclasses.replace(profile, graphs=quick))
    dec = SpeculativeDecoder(bundle, threads=1)
    dec.variant("ar").generate(PROMPT, max_new_tokens=40)
    assert dec.planning.live_ratio() > 1 and not dec.planning.remeasured
    assert dp.load_profile(bundle, threads=1).graphs == quick


def test_off_ignores_a_cached_profile(bundle, home, monkeypatch):
    dp.ensure_profile(bundle, threads=1)
    monkeypatch.setenv(dp.MODE_ENV, "off")
    assert SpeculativeDecoder(bundle, threads=1).planning.plan.source == "export"
    monkeypatch.setenv(dp.MODE_ENV, "sometimes")
    from edgespec.errors import GenerationError
    with pytest.raises(GenerationError, match="auto, cached or off"):
        SpeculativeDecoder(bundle, threads=1)


def test_probe_ids_are_the_targets_tokens(bundle):
    ids = dp.probe_ids(bundle, 40)
    assert len(ids) == 40 and all(0 <= i < bundle.target.vocab_size for i in ids)
    assert np.asarray(ids).min() >= 0


def test_model_steps_beside_a_prefill_graph_that_pads_attention(bundle, home):
    """The prefill graph is made from the padded-attention graph (one pad row); a plan on model.onnx (none)
    still prefills long prompts on it: each forward feeds its own session's mask. Greedy output = ar's."""
    from edgespec.runtime.engine.kv import PREFILL_GRAPH_TOKENS
    profile, _ = dp.ensure_profile(bundle, threads=1)
    bad = dp.GraphProfile(measured=True, one_token_exact=False, wide_exact=False, one_token_max_abs_diff=0.58,
                          wide_max_abs_diff=0.58, cost_ms=profile.graphs["padded_attention"].cost_ms)
    model = dp.GraphProfile(measured=True, one_token_exact=False, wide_exact=True, one_token_max_abs_diff=1e-6,
                            wide_max_abs_diff=0.0, cost_ms=[1.0 + 0.1 * k for k in range(dp.TAIL)])
    _write(dataclasses.replace(profile, graphs={"padded_attention": bad, "model": model}, drafter_step_ms=0.01))
    for kv in ("auto", "copy"):
        dec = SpeculativeDecoder(bundle, threads=1, prefill_graph=True)
        if kv == "copy":                                     # the copying layout, same sessions
            from edgespec.runtime.engine.kv import ModelRunner
            t = dec.target
            dec.shared.target = ModelRunner(t.session, "target", t.max_position, kv="copy",
                                             prefill_session=t.prefill_session)
            dec.target.min_tokens = 2
            dec.auto_variants.clear()
        assert dec.target.pad_rows == 0 and dec.target.prefill_pad_rows == 1
        prompt = (PROMPT + "\n") * 4
        ids = dec.encode_prompt(prompt)
        assert len(ids) >= PREFILL_GRAPH_TOKENS
        want = dec.variant("ar").generate(ids, max_new_tokens=20).token_ids
        res = dec.generate(ids, max_new_tokens=20)
        assert res.token_ids == want and dec.target.prefill_graph_rows >= len(ids)


def test_doctor_prints_the_profile_and_the_plan(tiny_padded_bundle, home, capsys):
    from edgespec.cli import main
    assert main(["doctor", "--bundle", str(tiny_padded_bundle), "--threads", "1"]) == 0
    out = capsys.readouterr().out
    assert "machine:" in out and "device profile (measured now" in out and "padded_attention.onnx" in out
    assert "\nplan (profile):" in out and "why:" in out and "drafter step" in out
    assert main(["doctor", "--bundle", str(tiny_padded_bundle), "--threads", "1", "--json", "--acceptance", "0.1"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["plan"]["acceptance"] == 0.1 and doc["profile"]["key"]["threads"] == 1
    assert "measured now" not in json.dumps(doc)                       # the cached one, read
    assert main(["doctor", "--bundle", str(tiny_padded_bundle), "--acceptance", "1.5"]) == 2
    assert "--acceptance must be in [0, 1]" in capsys.readouterr().err


def test_a_gpu_eps_profile_plans_its_decoders_and_not_the_cpus(bundle, home):
    """The H200's costs at the Qwen2.5-1.5B shape (fp16, 2026-11-27): a k-token forward 1.05x a step at k=2,
    the pruned drafter 0.77x a step. A profile keyed to the CUDA EP gives plain decoding (no drafter), and
    only to decoders on that EP; the CPU's plan is unchanged by it."""
    cpu_plan = dp.plan_for(bundle, 1, "cpu")[1]
    model = dp.GraphProfile(measured=True, one_token_exact=True, wide_exact=True, one_token_max_abs_diff=0.0,
                            wide_max_abs_diff=0.0, cost_ms=[4.1, 4.3, 4.6, 5.6, 5.9, 6.2, 6.6, 7.0, 7.4])
    gpu = dp.DeviceProfile(key=dp.profile_key(bundle, 1, "cuda"), graphs={"model": model}, drafter_step_ms=3.2,
                           measure_s=1.0, measured_utc="-")
    assert gpu.key["ep"] == "CUDAExecutionProvider" and dp.profile_key(bundle, 1)["ep"] == "CPUExecutionProvider"
    dp.save_profile(gpu)
    profile, plan = dp.plan_for(bundle, 1, "cuda")
    assert profile == gpu and plan.source == "profile" and not plan.drafter and plan.step_tokens == 1
    assert "the drafter does not pay here" in plan.reasons[-1]
    assert dp.load_profile(bundle, 1, "cpu") is None and dp.plan_for(bundle, 1, "cpu")[1] == cpu_plan


def test_a_cuda_int4_profile_runs_the_targets_own_steps_and_no_profile_no_drafter(bundle, home):
    """The H200's int4 costs at the Qwen2.5-1.5B shape (2026-11-27): 1-token steps differ from wider ones
    (CUDA's GEMV path), a 2-token forward costs 1.17x one, the drafter 0.77x: no drafter, and unpadded
    1-token steps (what onnxruntime-genai runs) rather than padded ones with lookup guesses. Without any
    profile a decoder off the CPU EP starts without the drafter (the export's plan on the CPU keeps it)."""
    assert dp.plan_for(bundle, 1, "cuda")[1].drafter is False
    assert dp.plan_for(bundle, 1, "cpu")[1].drafter is True
    model = dp.GraphProfile(measured=True, one_token_exact=False, wide_exact=True, one_token_max_abs_diff=0.027,
                            wide_max_abs_diff=0.0, cost_ms=[4.0, 4.68, 5.44, 5.8, 6.2, 6.6, 7.0, 7.4, 7.8])
    dp.save_profile(dp.DeviceProfile(key=dp.profile_key(bundle, 1, "cuda"), graphs={"model": model},
                                     drafter_step_ms=3.08, measure_s=1.0, measured_utc="-"))
    plan = dp.plan_for(bundle, 1, "cuda")[1]
    assert not plan.drafter and plan.step_tokens == 2 and plan.plain_steps == "fast"
    assert "the target's own decoding" in plan.describe()
