"""A decoder's plan over its life: the plan its sessions were made for, re-planned as acceptance is measured,
and the device profile measured beside it where this machine has none yet.

`SpeculativeDecoder` makes one `DevicePlanning` from `device_profile.plan_for` before it creates its
sessions: the plan's graph runs the target for the decoder's whole life. `current()` is the plan on that
graph at the acceptance measured so far (the drafter's draft-length governor: decayed counts per draft
position over the drafter's whole life in this decoder, once MIN_REACHED positions were reached), which
decides, before each generation of strategy="auto", whether the drafter runs and the range of gamma
(runtime/planning/plan.py): a drafter starts where it beats plain decoding by DRAFTER_MARGIN on paper, and a
running one stops only below KEEP_MARGIN, both counting the drafter's window fill per token as measured
in this decoder's generations that ran it. Where the plan's steps pad, it also books how often a lookup
guess would have been kept on each output (lookup.guess_record), which decides between padded plain
steps with guesses and unpadded 1-token ones (runtime/planning/plan.py). The formula is the prior: once a
generation has speculated, what such generations realized decides (`realized_speedup`: their decode
rate, window fill and catch-up included, over the target's own 1-token steps at their own context and
load, averaged weighted by each generation's own steps, older ones decayed: `RealizedRate`): the drafter
runs while its generations' average is KEEP_MARGIN or more, and without it lookup drafts run while
theirs is (`_plain_mode`).
Where the drafter stopped paying, every REPROBE_EVERY-th generation still runs it, so that what it does
on the prompts this app sends keeps being measured. Inside a generation the draft-length governor moves
between drafter rounds and plain steps round by round (runtime/round/governor.py); a generation's choice
between exact and unpadded steps is made before it starts (the lossless rule, docs/runtime.md).

Without a cached profile ($EDGESPEC_DEVICE_PROFILE=auto, a decoder made with strategy "auto" on any EP,
the one the plan is for) the profile is measured once, after the decoder's first generation ends, on a
thread that holds the decoder's lock (a call that comes meanwhile waits for it): never in a first
token's time. Its sessions are the decoder's where it has them (the step graph's, a built drafter's);
the process waits for it at exit, so it is measured once per machine. It plans the next generations of
this decoder (drafter and gamma; the graph at the next load).

A profile measured while other processes kept BUSY_CORES or more busy (device_profile.py) is measured again
once, after the decoder's first generation. A cached profile is checked against the forwards the decoder
times as it runs: where they take STALE_RATIO
of the profile's cost of the same width or less (the median over LIVE_SAMPLES or more forwards), the
profile was measured while something else used the CPU, and it is measured again the same way, once per
decoder, saying so in one line. Live forwards sit at longer contexts than the probe's, so they are never
faster for that reason. (On 2026-11-27 the Xeon's cached profile said 182 ms a 1-token forward, measured
while four other jobs ran; its forwards take 56 ms, and the drafter's step is 0.23 of one, not 0.14.)
"""
from __future__ import annotations

import atexit
import sys
import threading
from collections import deque
from dataclasses import replace
from statistics import median

from edgespec.runtime.planning.device_profile import ensure_profile, graph_paths, profile_mode
from edgespec.runtime.samplers.lookup import guess_record
from edgespec.runtime.planning.plan import DRAFTER_MARGIN, KEEP_MARGIN, make_plan
from edgespec.runtime.engine.thread_scaling import BUSY_CORES, others_busy_now

MIN_REACHED = 64         # draft positions reached before the measured acceptance replaces the prior
REPROBE_EVERY = 8        # generations without the drafter between two with it, once it stopped paying
STALE_RATIO = 0.7        # live forwards this much faster than the profile says: it was measured on a busy CPU
LIVE_SAMPLES = 24        # live forwards before they are compared with the profile
LIVE_KEPT = 256          # the latest live forwards kept
MIN_GUESSES = 64         # simulated lookup guesses before their kept share replaces the plan's prior
MIN_FILL_TOKENS = 256    # tokens of drafter generations before their window fill counts in the plan
REALIZED_WEIGHT = 0.4    # decay of older generations in a mode's realized speedup, per newer one (a few decide)
MIN_REALIZED_TOKENS = 8  # a generation shorter than this says too little about its rate
_RUNNING: list[threading.Thread] = []


def _join_running() -> None:
    if any(t.is_alive() for t in _RUNNING):
        print("edgespec: finishing this machine's device profile (once per machine)", file=sys.stderr, flush=True)
    for t in list(_RUNNING):
        t.join()


atexit.register(_join_running)


class DevicePlanning:
    def __init__(self, bundle, threads, ep, profile, plan, measure: bool = True):
        self.bundle, self.threads, self.ep = bundle, threads, ep
        self.measure = measure             # measure a missing profile (decoders of strategy "auto" do)
        self.profile = profile
        self.plan = plan                   # the plan the decoder's sessions were made for
        self.drafter_reached = self.drafter_accepted = 0     # the drafter rounds' draft positions, all generations
        self.drafter_running = plan.drafter    # the last plan ran the drafter (its margin: KEEP_MARGIN)
        self.generations_without = 0      # generations since the drafter last ran, once it stopped paying
        self.measuring: threading.Thread | None = None
        self.measure_note: str | None = None
        self.live_ms: deque[tuple[int, float]] = deque(maxlen=LIVE_KEPT)    # (width, ms) of the latest forwards
        self.remeasured = False
        self.quiet_checked = False        # _quiet_now ran (once per decoder)
        self.guess_steps = self.guesses_kept = 0    # lookup guesses on this decoder's outputs (lookup_share)
        self.fill_ms, self.drafted_tokens = 0.0, 0   # the drafter's window fills, and the tokens of their generations
        self.drafter_rate = RealizedRate()   # drafter generations' speedup over the target's own decoding, as run
        self.lookup_rate = RealizedRate()    # ... and that of generations with lookup drafts alone
        self.lookup_without = 0           # generations without lookup drafts since they last ran (re-probes)

    @property
    def realized(self) -> float | None:
        return self.drafter_rate.value

    @property
    def realized_lookup(self) -> float | None:
        return self.lookup_rate.value

    def acceptance(self) -> float | None:
        """The drafter's per-position acceptance over its life in this decoder, None before MIN_REACHED positions."""
        if self.drafter_reached < MIN_REACHED:
            return None
        return self.drafter_accepted / self.drafter_reached

    def lookup_share(self) -> float | None:
        """The share of padded plain steps whose lookup guess would have been kept on this decoder's
        outputs (lookup.guess_record), None before MIN_GUESSES steps."""
        return self.guesses_kept / self.guess_steps if self.guess_steps >= MIN_GUESSES else None

    def fill_per_token(self) -> float:
        """The drafter's window fill per token committed, over this decoder's generations that ran it; 0
        before MIN_FILL_TOKENS tokens (a benchmark's 8-token warm-up alone said 18 ms a token)."""
        return self.fill_ms / self.drafted_tokens if self.drafted_tokens >= MIN_FILL_TOKENS else 0.0

    def verify_costs(self) -> tuple[float, ...]:
        """The profile's k-token forward costs on the plan's graph (ms, k = 1..); empty without a profile."""
        g = self.profile.graphs.get(self.plan.step_graph) if self.profile is not None else None
        return tuple(g.cost_ms) if g is not None and g.measured else ()

    def current(self):
        """The plan for the next generation (module docstring)."""
        if self.profile is None:
            return self.plan
        graph, alpha = self.plan.step_graph, self.acceptance()
        margin = KEEP_MARGIN if self.drafter_running else DRAFTER_MARGIN
        kept, fill = self.lookup_share(), self.fill_per_token()
        plan = make_plan(self.profile, alpha, graph=graph, margin=margin, lookup_kept=kept, fill_ms=fill)
        if self.realized is not None:         # what the drafter's generations did here decides, not the formula
            keep = self.realized >= KEEP_MARGIN
            if keep != plan.drafter:
                plan = make_plan(self.profile, alpha, graph=graph, margin=0.0 if keep else float("inf"),
                                 lookup_kept=kept, fill_ms=fill)
            plan = replace(plan, reasons=plan.reasons + (
                f"the drafter's generations here ran {self.realized:.2f}x the target's own decoding (their decode "
                f"time, window fill included): it {'keeps running' if keep else 'stops'}",))
        if not plan.drafter:
            plan = self._plain_mode(plan)
        self.drafter_running = plan.drafter
        if plan.drafter:
            self.generations_without = 0
            return plan
        self.generations_without += 1
        if self.generations_without <= REPROBE_EVERY:
            return plan
        prior = make_plan(self.profile, None, graph=graph, lookup_kept=kept, fill_ms=fill)
        if not prior.drafter:
            return plan
        self.generations_without = 0
        return replace(prior, acceptance=plan.acceptance, reasons=plan.reasons + (
            f"the drafter runs once every {REPROBE_EVERY + 1} generations to keep its acceptance measured",))

    def _plain_mode(self, plan):
        """Without the drafter: prompt-lookup drafts and guesses (`ngram`) or the target's own 1-token steps
        (`ar-fast`), as the lookup generations realized here decide; with lookup off, one generation in
        REPROBE_EVERY + 1 still runs it (what the app sends may start to repeat itself)."""
        r = self.realized_lookup
        if r is None or plan.gamma_max == 0:
            return plan
        if r >= KEEP_MARGIN:
            self.lookup_without = 0
            how, steps = "its lookup drafts keep running", "exact"
        elif self.lookup_without >= REPROBE_EVERY:
            self.lookup_without = 0
            how, steps = f"its lookup drafts run once every {REPROBE_EVERY + 1} generations to keep measuring them", \
                "exact"
        else:
            self.lookup_without += 1
            how, steps = "plain 1-token steps without lookup drafts", "fast"
        return replace(plan, plain_steps=steps, reasons=plan.reasons + (
            f"generations with lookup drafts alone ran {r:.2f}x the target's own decoding here: {how}",))

    def after_generation(self, record, shared) -> None:
        """Book a finished generation's record (records.GenerationRecord): its drafter acceptance, its timed
        forwards and, where the plan's steps pad (1-token steps may be faster), how often a lookup guess
        would have been kept on its output; where this machine has no profile yet, or its profile is
        stale (module docstring), start measuring it on the decoder's sessions (`shared`: shared.Shared)."""
        stats, prompt_ids, output_ids = record.stats, record.prompt_ids, record.output_ids
        self.drafter_reached += record.drafter_reached
        self.drafter_accepted += record.drafter_accepted
        unpadded = record.step.unpadded         # its plain steps are not the profile's widths
        if stats.draft_forwards:
            self.fill_ms += stats.draft_prefill_ms
            self.drafted_tokens += max(stats.new_tokens - stats.prefill_tokens, 1)
        if stats.draft_forwards or stats.drafted or stats.guesses:       # it speculated: judge it as run
            speedup = realized_speedup(stats, self.profile, self.plan)
            if speedup is not None:
                (self.drafter_rate if stats.draft_forwards else self.lookup_rate).add(speedup, own_steps(stats))
        for k, ms in stats.verify_ms_by_k.items():
            self.live_ms.extend((k, m) for m in ms if k > 1 or not unpadded)
        if self.profile is not None and self.plan.step_tokens >= 2 and len(output_ids) > 1:
            steps, kept = guess_record(prompt_ids, output_ids)
            self.guess_steps, self.guesses_kept = self.guess_steps + steps, self.guesses_kept + kept
        if not (self.measure and self.measuring is None and profile_mode() == "auto"):
            return
        remeasure = False
        if self.profile is not None:
            ratio = self.live_ratio()
            beside = self.profile.measured_beside_others and not self.remeasured and self._quiet_now()
            if self.remeasured or not beside and (ratio is None or ratio > STALE_RATIO):
                return
            remeasure = self.remeasured = True
            why = f"other processes kept {self.profile.others_busy_cores:.1f} cores busy while it was measured" \
                if beside else f"this machine's forwards run {1 / ratio:.1f}x faster than it says (measured while " \
                               "the CPU was busy)"
            print(f"edgespec: the device profile is measured again: {why}", file=sys.stderr)
        self.measuring = threading.Thread(target=self._measure, args=(shared, remeasure), daemon=True,
                                          name="edgespec-device-profile")
        _RUNNING.append(self.measuring)
        self.measuring.start()

    def live_ratio(self) -> float | None:
        """The median of (live forward ÷ the profile's forward of the same width, on the plan's graph);
        None before LIVE_SAMPLES forwards or without a profile of that graph."""
        g = self.profile.graphs.get(self.plan.step_graph) if self.profile is not None else None
        if g is None or not g.measured or len(self.live_ms) < LIVE_SAMPLES:
            return None
        width = lambda k: max(k, self.plan.step_tokens)     # noqa: E731 - a padded step runs 2 tokens
        ratios = [ms / g.cost_ms[width(k) - 1] for k, ms in self.live_ms if width(k) <= len(g.cost_ms)]
        return float(median(ratios)) if len(ratios) >= LIVE_SAMPLES else None

    def _quiet_now(self) -> bool:
        """Once per decoder: whether other processes now leave the cores quieter than BUSY_CORES (a profile
        measured beside them is then measured again; on a machine that stays busy it is kept)."""
        if self.quiet_checked:
            return False
        self.quiet_checked = True
        busy = others_busy_now()
        return busy is not None and busy < BUSY_CORES

    def wait(self) -> None:
        """Until a measurement this decoder started has ended (a benchmark times nothing beside it)."""
        if self.measuring is not None:
            self.measuring.join()

    def _measure(self, shared, remeasure: bool = False) -> None:
        try:
            with shared.lock:               # the decoder's lock: no generation meanwhile
                sessions = {graph_paths(self.bundle)[self.plan.step_graph]: shared.target.session}
                drafter = shared.drafter
                drafter_session = None if drafter is None or drafter.pending else drafter.session
                self.profile, measured = ensure_profile(self.bundle, self.threads, remeasure=remeasure, ep=self.ep,
                                                        sessions=sessions, drafter_session=drafter_session)
                if measured:
                    self.measure_note = f"device profile measured in {self.profile.measure_s:.1f} s"
        except Exception as exc:     # noqa: BLE001 - a failed measurement leaves the export's plan in place
            print(f"edgespec: the device profile could not be measured ({str(exc)[:120]}); the export's plan "
                  "stays", file=sys.stderr)
        finally:
            if self.measuring in _RUNNING:
                _RUNNING.remove(self.measuring)


class RealizedRate:
    """One mode's realized speedup (`realized_speedup`) over its generations, each weighted by its own steps
    (`own_steps`), older ones decayed by REALIZED_WEIGHT per newer generation: in an agent's loop a 4-step
    tool call whose drafts lost says less about lookup than the 400-token file it writes next, which
    copies what it read (pooled, the decode time is what a user waits for)."""

    def __init__(self):
        self.total = self.weight = 0.0

    def add(self, speedup: float, steps: int) -> None:
        self.total = (1.0 - REALIZED_WEIGHT) * self.total + steps * speedup
        self.weight = (1.0 - REALIZED_WEIGHT) * self.weight + steps

    @property
    def value(self) -> float | None:
        return self.total / self.weight if self.weight else None


def own_steps(stats) -> int:
    """The 1-token steps the target's own decoding takes for a generation's tokens after the first:
    under a grammar the forced ones come free (a forced run and the token after it in one forward:
    rounds.forced_round), so they are left out."""
    return max(stats.new_tokens - stats.prefill_tokens - stats.forced_accepted, 1)


def realized_speedup(stats, profile, plan) -> float | None:
    """A speculative generation's decode rate over the target's own decoding (unpadded 1-token steps:
    `ar-fast`, what onnxruntime-genai runs) on the plan's graph, at this generation's context and load: its
    time after the first token (window fill and catch-up included, session builds not) per token, against
    the profile's 1-token step scaled by how much slower than the profile this generation's own target
    forwards ran, over the steps it would take (`own_steps`: forced tokens left out). None without a
    profile or enough tokens."""
    tokens = stats.new_tokens - stats.prefill_tokens
    g = profile.graphs.get(plan.step_graph) if profile is not None else None
    if g is None or not g.measured or tokens < MIN_REALIZED_TOKENS:
        return None
    width = lambda k: max(k, plan.step_tokens)         # noqa: E731 - exact steps pad to step_tokens
    ratios = [ms / g.cost_ms[width(k) - 1] for k, runs in stats.verify_ms_by_k.items() for ms in runs
              if width(k) <= len(g.cost_ms)]
    if not ratios:
        return None
    decode_ms = stats.total_ms - stats.ttft_ms - stats.drafter_load_ms
    return g.cost_ms[0] * median(ratios) * own_steps(stats) / max(decode_ms, 1e-6)


def wait_for_profile(decoder) -> None:
    """Until a profile measurement the decoder started has ended (a peer row has none)."""
    planning = getattr(decoder, "planning", None)
    if planning is not None:
        planning.wait()


def profile_measured_again(decoders) -> dict | None:
    """The profile one of these decoders measured again as stale, as JSON; None where none did."""
    for d in decoders:
        planning = getattr(d, "planning", None)
        if planning is not None and planning.remeasured and planning.profile is not None:
            return planning.profile.to_json()
    return None
