"""The plan (runtime/planning/plan.py) from injected device profiles: a batch-invariant CPU, one like the 2-core AVX2
EPYC without VNNI of 2026-11-27 (padded-attention graph inexact, a 2-token forward 1.23x a 1-token step,
a drafter step 0.30x, 1-token steps not exact), one where only 1-token steps are exact, and a more
compute-bound one where the drafter never pays."""
import pytest

from edgespec.runtime.planning.device_profile import DeviceProfile, GraphProfile
from edgespec.runtime.planning.plan import DRAFTER_MARGIN, LOOKUP_PRIOR, PRIOR_ACCEPTANCE, export_plan, make_plan, tau
from edgespec.runtime.round.strategies import choose_auto


def curve(step: float, ratios) -> list[float]:
    return [round(step * r, 3) for r in ratios]


def exact(cost, one=True) -> GraphProfile:
    return GraphProfile(measured=True, one_token_exact=one, wide_exact=True, one_token_max_abs_diff=0.0 if one else 0.2,
                        wide_max_abs_diff=0.0, cost_ms=cost)


def inexact(cost, diff=0.583) -> GraphProfile:
    return GraphProfile(measured=True, one_token_exact=False, wide_exact=False, one_token_max_abs_diff=diff,
                        wide_max_abs_diff=diff, cost_ms=cost)


def profile(graphs: dict, drafter_ms: float | None) -> DeviceProfile:
    return DeviceProfile(key={}, graphs=graphs, drafter_step_ms=drafter_ms, measure_s=1.0, measured_utc="-")


# memory-bound ratios of a k-token forward to a 1-token one (int4 1.5B, 2-core Xeon), k = 1..9
XEON = (1.0, 1.1, 1.15, 1.2, 1.25, 1.3, 1.4, 1.5, 1.65)
# the EPYC's: 2 tokens 1.23x, 3 tokens 1.7x, 5 tokens 2.44x (FACTS.md, 2026-11-24/27)
EPYC = (1.0, 1.23, 1.7, 2.07, 2.44, 2.8, 3.2, 3.6, 4.0)


def batch_invariant() -> DeviceProfile:
    return profile({"padded_attention": exact(curve(62.6, XEON)), "model": exact(curve(64.0, XEON))}, 19.0)


def epyc_like() -> DeviceProfile:
    return profile({"padded_attention": inexact(curve(98.0, EPYC)),
                    "model": exact(curve(100.6, EPYC), one=False),
                    "prefill": GraphProfile(cost_ms=[260.0], note="1-token forward 260.0 ms, slower")}, 30.2)


def only_one_token() -> DeviceProfile:
    return profile({"padded_attention": inexact(curve(62.0, XEON), 0.1), "model": inexact(curve(64.0, XEON), 0.1)},
                   19.0)


def test_a_batch_invariant_cpu_runs_the_cheapest_exact_step_and_speculates():
    plan = make_plan(batch_invariant())
    assert plan.step_graph == "padded_attention" and plan.step_tokens == 1 and not plan.free_guess
    assert plan.drafter and 1 <= plan.gamma_max <= 8 and plan.source == "profile"
    assert "plan" in plan.describe() and "padded_attention.onnx" in plan.describe()
    # the cheaper graph wins when the costs swap
    swapped = profile({"padded_attention": exact(curve(70.0, XEON)), "model": exact(curve(64.0, XEON))}, 19.0)
    assert make_plan(swapped).step_graph == "model" and make_plan(swapped).step_tokens == 1


def test_an_epyc_like_cpu_pads_model_onnx_and_speculates_only_where_acceptance_pays():
    p = epyc_like()
    plan = make_plan(p)
    assert plan.step_graph == "model" and plan.step_tokens == 2 and plan.free_guess
    assert plan.drafter and plan.gamma_max <= 2                     # verify costs grow fast: short drafts only
    padded = 1000 * (1 + LOOKUP_PRIOR) / p.graphs["model"].cost_ms[1]      # padded steps with free guesses
    assert plan.rates[("model", 0)] == pytest.approx(padded)
    assert plan.rates[("model", "1-token")] == pytest.approx(1000 / 100.6)  # unpadded: ar-fast
    assert plan.rates[("model", 1)] == pytest.approx(1000 * tau(PRIOR_ACCEPTANCE, 1) / (30.2 + 123.738))
    low = make_plan(p, acceptance=0.3)                              # 1.3 / 1.53 of a 1-token step: 0.85x
    assert not low.drafter and low.step_graph == "model" and low.free_guess and low.gamma_max == 8
    assert any("does not pay" in r for r in low.reasons)
    assert any("padded_attention.onnx" in r and "disagree" in r for r in plan.reasons)
    assert any("prefill.onnx" in r and "slower" in r for r in plan.reasons)
    assert choose_auto(_Bundle(), True, drafter=plan.drafter) == "ngram-tli"
    # without the drafter, unpadded 1-token steps (the target's own decoding) beat padded steps with
    # lookup guesses, unless the guesses are kept more than 1.23 - 1 of the time
    assert low.plain_steps == "fast" and "plain 1-token steps" in low.describe()
    assert any("unpadded 1-token steps" in r for r in low.reasons)
    assert choose_auto(_Bundle(), True, drafter=low.drafter, fast_plain=True) == "ar"
    copied = make_plan(p, acceptance=0.3, lookup_kept=0.3)
    assert copied.plain_steps == "exact" and not copied.drafter
    assert choose_auto(_Bundle(), True, drafter=copied.drafter) == "ngram"


def test_on_an_epyc_like_cpu_the_drafter_must_beat_unpadded_steps():
    """Acceptance 0.6: a drafter round is 1.22x a padded step with guesses on paper, but 1.05x an
    unpadded 1-token step (ar-fast): under DRAFTER_MARGIN, so no drafter."""
    p = epyc_like()
    plan = make_plan(p, acceptance=0.6)
    spec, fast = plan.rates[("model", 1)], plan.rates[("model", "1-token")]
    assert spec / plan.rates[("model", 0)] > DRAFTER_MARGIN > spec / fast > 1.0
    assert not plan.drafter and plan.plain_steps == "fast"
    # where 1-token steps are exact there is nothing to unpad: the plain plan keeps its lookup guesses
    plain = make_plan(batch_invariant(), acceptance=0.1)
    assert not plain.drafter and plain.plain_steps == "exact" and plain.step_tokens == 1


def test_only_one_token_steps_exact_means_no_speculation():
    plan = make_plan(only_one_token())
    assert plan.gamma_max == 0 and not plan.drafter and not plan.free_guess and plan.step_tokens == 1
    assert choose_auto(_Bundle(), True, drafter=plan.drafter, exact=plan.gamma_max > 0) == "ar"


def test_the_drafter_never_pays_on_a_compute_bound_cpu():
    """threads=1 on a weaker CPU: a drafter step 0.5x a target step and every extra token +60%."""
    steep = (1.0, 1.6, 2.2, 2.8, 3.4, 4.0, 4.6, 5.2, 5.8)
    p = profile({"padded_attention": exact(curve(140.0, steep))}, 70.0)
    for alpha in (0.5, 0.7, 0.9):
        assert not make_plan(p, acceptance=alpha).drafter
    cheap = profile({"padded_attention": exact(curve(140.0, XEON))}, 70.0)   # the same drafter, flat verify costs
    assert make_plan(cheap, acceptance=0.9).drafter


def test_the_margin_is_the_line():
    """drafter exactly at the margin: on; just below: off (the decision is the documented formula)."""
    alpha = 0.6
    v = 100.0
    d = (tau(alpha, 1) * 100.0 / DRAFTER_MARGIN) - v     # rate(1) = margin * rate(0) at a 100 ms step
    p = profile({"model": exact([100.0, v, 180.0, 260.0])}, d - 1e-6)
    assert make_plan(p, acceptance=alpha, max_gamma=1).drafter
    p = profile({"model": exact([100.0, v, 180.0, 260.0])}, d + 0.5)
    assert not make_plan(p, acceptance=alpha, max_gamma=1).drafter


def test_a_plan_restricted_to_the_loaded_graph():
    p = batch_invariant()
    assert make_plan(p, graph="model").step_graph == "model"
    assert make_plan(epyc_like(), graph="padded_attention").gamma_max == 0


def test_no_drafter_in_the_bundle():
    p = profile({"padded_attention": exact(curve(62.6, XEON))}, None)
    plan = make_plan(p)
    assert not plan.drafter and plan.gamma_max == 8 and any("no drafter" in r for r in plan.reasons)


def test_the_export_plan_is_the_behaviour_before_profiles():
    assert export_plan(True, 2, True).step_graph == "padded_attention"
    assert export_plan(True, 2, True).step_tokens == 1
    old = export_plan(False, 2, True)               # the export's check failed there
    assert old.step_graph == "model" and old.step_tokens == 2 and old.free_guess and old.drafter
    assert export_plan(False, 1, False).step_tokens == 1


class _Bundle:
    same_tokenizer = True


def book(planning, reached: int, accepted: int) -> None:
    """One generation's record whose drafter rounds reached `reached` draft positions (up to each round's
    first rejection) and had `accepted` of them accepted."""
    from edgespec.runtime.planning.records import GenerationRecord
    from edgespec.runtime.api.stats import GenerationStats
    planning.after_generation(GenerationRecord(GenerationStats(), [], [], drafter_reached=reached,
                                               drafter_accepted=accepted), None)


def test_a_decoder_replans_on_its_drafters_lifetime_acceptance_and_reprobes_it():
    from edgespec.runtime.planning.device_plan import MIN_REACHED, REPROBE_EVERY, DevicePlanning
    profile = epyc_like()
    planning = DevicePlanning(None, 2, "cpu", profile, make_plan(profile), measure=False)
    assert planning.current().drafter and planning.acceptance() is None      # the prior
    book(planning, MIN_REACHED // 2 - 1, 0)                                  # too few positions: still the prior
    assert planning.acceptance() is None and planning.current().drafter
    book(planning, 40, 0)                                                    # 0.2 per position: off
    assert planning.acceptance() < 0.3
    runs = [planning.current().drafter for _ in range(2 * (REPROBE_EVERY + 1))]
    assert runs.count(True) == 2 and runs[REPROBE_EVERY] and runs[-1]         # one generation in REPROBE_EVERY + 1
    probe = [p for p in (planning.current() for _ in range(REPROBE_EVERY + 1)) if p.drafter][0]
    assert probe.gamma_max >= 1 and "keep its acceptance measured" in probe.reasons[-1]
    book(planning, 800, 800)                                                 # the probes find it paying again
    assert planning.acceptance() > 0.8 and planning.current().drafter


def test_a_running_drafter_stops_only_where_it_does_not_pay_on_paper():
    """Hysteresis: on the EPYC-like profile acceptance 0.6 is 1.05x unpadded plain steps on paper, under
    DRAFTER_MARGIN (a drafter does not start there) and over KEEP_MARGIN (one that runs keeps running);
    0.4 is 0.92x (it stops)."""
    from edgespec.runtime.planning.device_plan import MIN_REACHED, DevicePlanning
    from edgespec.runtime.planning.plan import KEEP_MARGIN
    p = epyc_like()
    assert KEEP_MARGIN < DRAFTER_MARGIN
    assert not make_plan(p, acceptance=0.6).drafter and make_plan(p, acceptance=0.6, margin=KEEP_MARGIN).drafter

    def planning_at(alpha: float, running: bool) -> DevicePlanning:
        planning = DevicePlanning(None, 2, "cpu", p, make_plan(p), measure=False)
        planning.drafter_running = running
        rounds = max(300, MIN_REACHED)
        book(planning, rounds, sum(i % 100 < alpha * 100 for i in range(rounds)))
        assert planning.acceptance() == pytest.approx(alpha, abs=0.01)
        return planning
    running = planning_at(0.6, running=True)
    assert all(running.current().drafter for _ in range(20))             # keeps running
    stopped = planning_at(0.6, running=False)
    assert not stopped.current().drafter                                   # does not start again at 1.05x
    low = planning_at(0.4, running=True)
    assert not low.current().drafter and not low.current().drafter         # stops, and stays stopped


def test_the_gamma_range_is_never_narrower_than_at_the_prior():
    """The Xeon's idle profile (2026-11-27): at the calib split's lifetime acceptance 0.5 gamma 1 is best
    on paper, but the range stays the prior's (1..3): the governor finds longer drafts per prompt."""
    from edgespec.runtime.planning.plan import KEEP_MARGIN, gamma_range
    cost = [55.8, 65.5, 81.4, 88.4, 102.9, 113.4, 129.0, 140.2, 148.8]
    p = profile({"padded_attention": exact(cost)}, 12.7)
    assert gamma_range(cost, 12.7, 0.5) == 1 < gamma_range(cost, 12.7, PRIOR_ACCEPTANCE)
    low = make_plan(p, acceptance=0.5, margin=KEEP_MARGIN)
    assert low.drafter and low.gamma_max == make_plan(p).gamma_max == gamma_range(cost, 12.7, PRIOR_ACCEPTANCE)
    assert make_plan(p, acceptance=0.95).gamma_max >= low.gamma_max


def test_the_drafters_fill_counts_against_it():
    """The fill per token (measured in the decoder's drafter generations) is part of a round's cost: on the
    EPYC-like profile a running drafter at acceptance 0.6 keeps running without it (1.05x unpadded steps
    on paper) and stops at 7 ms a token (0.98x); on the Xeon's idle profile (its fill 1.6 ms a token,
    2026-11-27) one at the calib split's lifetime acceptance 0.5 keeps running (1.04x)."""
    from edgespec.runtime.planning.device_plan import DevicePlanning
    from edgespec.runtime.planning.plan import KEEP_MARGIN, round_rate
    p = epyc_like()
    assert make_plan(p, acceptance=0.6, margin=KEEP_MARGIN).drafter
    assert not make_plan(p, acceptance=0.6, margin=KEEP_MARGIN, fill_ms=7.0).drafter
    assert round_rate([10.0, 20.0], 5.0, 0.5, 1, fill_ms=2.0) == pytest.approx(1000 / (25 / 1.5 + 2))
    xeon = profile({"padded_attention": exact([55.8, 65.5, 81.4, 88.4, 102.9, 113.4, 129.0, 140.2, 148.8])}, 12.7)
    assert make_plan(xeon, acceptance=0.5, margin=KEEP_MARGIN, fill_ms=1.6).drafter
    planning = DevicePlanning(None, 2, "cpu", p, make_plan(p))
    assert planning.fill_per_token() == 0.0
    planning.fill_ms, planning.drafted_tokens = 140.0, 8             # one short generation does not decide
    assert planning.fill_per_token() == 0.0
    planning.fill_ms, planning.drafted_tokens = 2800.0, 400
    assert planning.fill_per_token() == 7.0


def test_the_lookup_guess_record_of_an_output():
    """By hand: after the prefill's token 9, no match (a step); "1" -> "2" kept (two tokens); "1 2 3" -> "4",
    but 7 came (a step). Every output token after the first is committed by exactly one step."""
    import numpy as np

    from edgespec.runtime.samplers.lookup import guess_record
    assert guess_record([1, 2, 3, 4, 5], [9, 1, 2, 3, 7]) == (3, 1)
    assert guess_record([1, 2], [3]) == (0, 0)
    rng = np.random.default_rng(0)
    for _ in range(20):
        prompt, out = rng.integers(0, 4, 30).tolist(), rng.integers(0, 4, 50).tolist()
        steps, kept = guess_record(prompt, out)
        assert 0 < kept < steps and steps + kept == len(out) - 1
    assert guess_record(prompt, out, limit=10)[0] + guess_record(prompt, out, limit=10)[1] == 10


def test_a_short_first_generation_does_not_stop_the_drafter():
    """A benchmark's warm-up (8 tokens, a 140 ms window fill: 18 ms a token) once switched the drafter off
    for a decoder's life; the fill counts only over MIN_FILL_TOKENS tokens of drafter generations."""
    from edgespec.runtime.planning.device_plan import MIN_FILL_TOKENS, DevicePlanning
    from edgespec.runtime.planning.records import GenerationRecord
    from edgespec.runtime.api.stats import GenerationStats
    p = profile({"padded_attention": exact([55.8, 65.5, 81.4, 88.4, 102.9, 113.4, 129.0, 140.2, 148.8])}, 12.7)
    planning = DevicePlanning(None, 2, "cpu", p, make_plan(p), measure=False)
    short = GenerationStats(new_tokens=9, prefill_tokens=1, draft_forwards=5, draft_prefill_ms=140.0)
    planning.after_generation(GenerationRecord(short, [], []), None)
    assert planning.drafted_tokens == 8 and planning.current().drafter
    long = GenerationStats(new_tokens=MIN_FILL_TOKENS + 1, prefill_tokens=1, draft_forwards=90,
                           draft_prefill_ms=140.0 * 40)
    planning.after_generation(GenerationRecord(long, [], []), None)
    assert planning.fill_per_token() > 18 and not planning.current().drafter
