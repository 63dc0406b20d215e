"""The plan corrected by what it measures (runtime/planning/device_plan.py): the AVX2 EPYC's profile (measured there
on 2026-11-27, tests/data/profiles) gives that machine's plan, and the drafter's realized speedup, not
the formula, decides whether it keeps running, with a bounded share of re-probes."""
import dataclasses
import json
from pathlib import Path

import pytest

from edgespec.runtime.planning.device_plan import REPROBE_EVERY, DevicePlanning, realized_speedup
from edgespec.runtime.planning.device_profile import DeviceProfile
from edgespec.runtime.planning.plan import make_plan
from edgespec.runtime.planning.records import GenerationRecord
from edgespec.runtime.api.stats import GenerationStats

AVX2 = Path(__file__).parent / "data" / "profiles" / "epyc-avx2-2t-qwen-coder-int4.json"
TOKENS = 96


@pytest.fixture
def avx2() -> DeviceProfile:
    return DeviceProfile.from_json(json.loads(AVX2.read_text()))


def drafter_generation(profile, speedup: float, slower: float = 1.0) -> GenerationStats:
    """The stats of a drafter generation of TOKENS + 1 tokens that ran `speedup` times the fastest plain
    decoding, on forwards `slower` times the profile's (a longer context, a busier CPU)."""
    cost = profile.graphs["model"].cost_ms
    fast_ms = cost[0] * slower
    decode = TOKENS * fast_ms / speedup
    return GenerationStats(new_tokens=TOKENS + 1, prefill_tokens=1, draft_forwards=60, draft_prefill_ms=30.0,
                           ttft_ms=500.0, total_ms=500.0 + decode,
                           verify_ms_by_k={1: [cost[1] * slower] * 5, 2: [cost[1] * slower] * 40})


def plain_generation() -> GenerationStats:
    return GenerationStats(new_tokens=TOKENS + 1, prefill_tokens=1, ttft_ms=500.0, total_ms=4000.0)


def record(stats: GenerationStats) -> GenerationRecord:
    return GenerationRecord(stats, [], [])


def test_the_avx2_profile_gives_that_machines_plan(avx2):
    plan = make_plan(avx2)
    assert plan.drafter and plan.gamma_max == 1 and plan.step_graph == "model" and plan.step_tokens == 2
    assert "speculative with the drafter, gamma 1..1; exact steps on model.onnx (padded 2-token forwards)" \
        in plan.describe()
    # at the extraction prompt's acceptance (0.38) the formula itself says plain 1-token steps
    low = make_plan(avx2, 0.38)
    assert not low.drafter and low.plain_steps == "fast"


def test_realized_speedup_reads_the_generation_at_its_own_context(avx2):
    plan = make_plan(avx2)
    for slower in (1.0, 1.5):
        assert realized_speedup(drafter_generation(avx2, 0.8, slower), avx2, plan) == pytest.approx(0.8)
        assert realized_speedup(drafter_generation(avx2, 1.2, slower), avx2, plan) == pytest.approx(1.2)
    assert realized_speedup(GenerationStats(new_tokens=4, prefill_tokens=1), avx2, plan) is None
    assert realized_speedup(drafter_generation(avx2, 1.0), None, plan) is None


def test_forced_tokens_are_free_to_the_targets_own_decoding_too(avx2):
    """Under a grammar, plain decoding with jump-forward also gets the forced tokens in its forwards: a
    tool call whose 16 tokens are 11 forced ones (what an agent's run_tests call was on 2026-11-28) is
    judged against 5 steps, not 16; the drafter's 1.2x over 16 steps is 0.375x over 5."""
    plan = make_plan(avx2)
    stats = drafter_generation(avx2, 1.2)
    free = dataclasses.replace(stats, forced=TOKENS * 11 // 16, forced_accepted=TOKENS * 11 // 16)
    assert realized_speedup(free, avx2, plan) == pytest.approx(1.2 * (TOKENS - TOKENS * 11 // 16) / TOKENS)
    planning = DevicePlanning(None, 2, "cpu", avx2, make_plan(avx2, 0.9), measure=False)
    assert planning.current().drafter
    planning.after_generation(record(free), None)
    assert not planning.current().drafter


def test_a_drafter_that_loses_as_run_stops_within_a_few_generations(avx2):
    planning = DevicePlanning(None, 2, "cpu", avx2, make_plan(avx2), measure=False)
    assert planning.current().drafter                              # the formula's prior: it pays on paper
    planning.after_generation(record(drafter_generation(avx2, 0.7)), None)
    plan = planning.current()
    assert not plan.drafter and plan.plain_steps == "fast"          # the fastest plain decoding: ar-fast
    assert "ran 0.70x the target's own decoding" in plan.reasons[-1] and "stops" in plan.reasons[-1]
    runs = []
    for _ in range(3 * (REPROBE_EVERY + 1)):
        plan = planning.current()
        runs.append(plan.drafter)
        planning.after_generation(record(drafter_generation(avx2, 0.7) if plan.drafter else plain_generation()), None)
    probes = [i for i, ran in enumerate(runs) if ran]               # one re-probe in REPROBE_EVERY + 1 generations
    assert len(probes) == 3 and probes[0] >= REPROBE_EVERY - 1 and {b - a for a, b in zip(probes, probes[1:])} == \
        {REPROBE_EVERY + 1}


def test_a_drafter_that_pays_as_run_keeps_running_where_the_formula_says_stop(avx2):
    planning = DevicePlanning(None, 2, "cpu", avx2, make_plan(avx2, 0.4), measure=False)
    planning.after_generation(record(drafter_generation(avx2, 1.15)), None)
    assert planning.current().drafter and planning.realized == pytest.approx(1.15)
    # two losing prompts in a row bring the average below 1: it stops; winning re-probes bring it back
    planning.after_generation(record(drafter_generation(avx2, 0.6)), None)
    planning.after_generation(record(drafter_generation(avx2, 0.6)), None)
    assert not planning.current().drafter
    for _ in range(4):
        planning.after_generation(record(drafter_generation(avx2, 1.4)), None)
    assert planning.current().drafter


def lookup_generation(profile, speedup: float) -> GenerationStats:
    """A generation of lookup drafts and guesses alone (no drafter forward) at `speedup` x the target's own
    decoding."""
    stats = drafter_generation(profile, speedup)
    stats.draft_forwards, stats.draft_prefill_ms, stats.drafted, stats.guesses = 0, 0.0, 30, 10
    return stats


def test_lookup_drafts_that_lose_as_run_give_way_to_the_targets_own_steps(avx2):
    """Without the drafter, generations of lookup drafts alone are judged as run too: below 1.0x the
    target's own decoding the default runs `ar-fast` (plain 1-token steps), re-probing lookup 1 in 9."""
    planning = DevicePlanning(None, 2, "cpu", avx2, make_plan(avx2, 0.38), measure=False)
    planning.after_generation(record(drafter_generation(avx2, 0.6)), None)  # the drafter stops
    planning.after_generation(record(lookup_generation(avx2, 1.3)), None)     # lookup pays (an edit)
    plan = planning.current()
    assert not plan.drafter and plan.plain_steps == "exact" and "1.30x" in plan.reasons[-1]
    for _ in range(3):
        planning.after_generation(record(lookup_generation(avx2, 0.8)), None)  # then it does not
    assert planning.realized_lookup < 1.0
    modes = []
    for _ in range(2 * (REPROBE_EVERY + 1)):
        plan = planning.current()
        modes.append("drafter" if plan.drafter else plan.plain_steps)
        if plan.drafter:
            planning.after_generation(record(drafter_generation(avx2, 0.6)), None)
        elif plan.plain_steps == "exact":
            planning.after_generation(record(lookup_generation(avx2, 0.8)), None)
        else:
            planning.after_generation(record(plain_generation()), None)
    # mostly the target's own steps; lookup and the drafter each re-probed about once in REPROBE_EVERY + 1
    assert modes.count("fast") >= 2 * REPROBE_EVERY - 4 and 1 <= modes.count("exact") <= 3 and modes.count("drafter") <= 3
    plan = planning.current()
    assert plan.drafter or plan.plain_steps == "exact" or "plain 1-token steps without lookup drafts" in plan.reasons[-1]


def test_a_mode_is_judged_by_its_generations_weighted_by_their_own_steps(avx2):
    """An agent's loop: a long answer whose lookup drafts paid (a file copied back) keeps lookup on through
    a short tool call whose drafts lost; a long losing answer turns it off."""
    planning = DevicePlanning(None, 2, "cpu", avx2, make_plan(avx2, 0.38), measure=False)
    planning.after_generation(record(drafter_generation(avx2, 0.6)), None)  # the drafter stops
    long_win = lookup_generation(avx2, 1.5)
    short_loss = lookup_generation(avx2, 0.7)
    short_loss.new_tokens, short_loss.forced_accepted = 16, 11            # 4 own steps after the first token
    short_loss.total_ms = short_loss.ttft_ms + 4 * avx2.graphs["model"].cost_ms[0] / 0.7
    planning.after_generation(record(long_win), None)
    planning.after_generation(record(short_loss), None)
    assert planning.realized_lookup == pytest.approx((0.6 * TOKENS * 1.5 + 4 * 0.7) / (0.6 * TOKENS + 4))
    assert planning.current().plain_steps == "exact"
    planning.after_generation(record(lookup_generation(avx2, 0.7)), None)
    planning.after_generation(record(lookup_generation(avx2, 0.7)), None)
    assert planning.realized_lookup < 1.0 and planning.current().plain_steps == "fast"
