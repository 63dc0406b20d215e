"""The decoding plan for a bundle on this machine: a pure function of (device profile, acceptance so far).

`make_plan(profile, acceptance)` (runtime/planning/device_profile.py measures the profile) decides:

- **which graph runs the exact steps**: among the target's graph variants whose forwards of 2+ tokens
  agree here (`wide_exact`), the one whose exact plain step is cheapest: a 1-token forward where
  1-token forwards are exact here, else a 2-token forward (runtime/engine/kv.py pads it, `step_tokens` 2);
- **whether the drafter pays at all**: on each such graph, with c(k) its measured k-token forward, d the
  drafter's step and alpha the acceptance per draft position (the running one, else PRIOR_ACCEPTANCE),

      tau(gamma)  = (1 - alpha^(gamma+1)) / (1 - alpha)        expected tokens per round
      rate(gamma) = 1 / ((gamma * d + c(gamma + 1)) / tau(gamma) + f)     tokens per ms;   rate(0) = 1 / step

  with f the drafter's window fill per committed token, as measured in this decoder's generations with
  the drafter (runtime/planning/device_plan.py; 0 before any): left out, the fill made the formula promise speedups
  that were not measured (docs/results.md).

  The drafter starts only where the best speculative rate beats the best exact plain rate by DRAFTER_MARGIN
  (what the formula leaves out: the drafter's window fill and catch-up, sampling, the round's
  bookkeeping); otherwise the default decodes plainly and never builds the drafter. A drafter that runs
  stops only where it does not pay even on paper (KEEP_MARGIN: a hysteresis, runtime/planning/device_plan.py):
  acceptance differs by prompt far more than the formula errs, and a round that does not pay falls back
  to a plain step anyway (runtime/round/governor.py);
- **the range of gamma**: 1..gamma_max, the draft lengths whose rate is within GAMMA_SLACK of the best at
  the acceptance or the prior, whichever is higher (the draft-length governor, runtime/round/governor.py,
  chooses inside it per round, from the acceptance of the prompt at hand);
- **lookup guesses**: free where the step pads to 2 tokens (the guess takes the padded row), else the
  governor's (they widen the forward: Governor.guess_pays);
- **plain 1-token steps** (`plain_steps` "fast") where the drafter does not run and the exact step pads:
  a generation that speculates nowhere is the target's own decoding with 1-token forwards (what
  onnxruntime-genai runs), and that is faster than padded steps with lookup guesses unless the guesses
  keep more than c(2) / c(1) - 1 of the steps (the kept share measured on this app's outputs,
  runtime/planning/device_plan.py, else LOOKUP_PRIOR). The drafter must beat that rate too, not only the padded
  one, which is slower where a padded step costs much more than a 1-token one (docs/results.md).

Without a profile (none measured yet on this machine, a GPU EP, or $EDGESPEC_DEVICE_PROFILE=off) the plan
is the export's (`export_plan`): the graph the export found exact, the drafter on, gamma up to the
decoder's max_draft_length (one above MAX_GAMMA also replaces a profile's range: decoder.py). Where no
graph's 2+-token forwards agree here, nothing speculative is exact: plain 1-token steps on model.onnx, no
guesses, no drafter.
"""
from __future__ import annotations

from dataclasses import dataclass, field

# Per-position acceptance before any is measured: the demo pair's on held-out prompts (docs/results.md).
PRIOR_ACCEPTANCE = 0.7
# The drafter must beat plain decoding by this much on paper: the formula promises more than the drafter
# measures (docs/results.md). The governor still falls back to plain rounds where drafting measures slower.
DRAFTER_MARGIN = 1.10
# A running drafter stops only where even the formula says it loses: a few low-acceptance prompts must not
# switch off a drafter that pays on the others (docs/results.md).
KEEP_MARGIN = 1.0
# The share of plain steps whose free lookup guess the target keeps, before this app's outputs measured
# it (the held-out figure: docs/results.md).
LOOKUP_PRIOR = 0.05
GAMMA_SLACK = 0.9
MAX_GAMMA = 8
GRAPH_WORDS = {"model": "model.onnx", "padded_attention": "padded_attention.onnx", "prefill": "prefill.onnx"}


@dataclass(frozen=True)
class Plan:
    step_graph: str                 # device_profile.GRAPHS name whose session runs every target forward
    step_tokens: int                # an exact plain step's width (2: a 1-token step padded)
    drafter: bool                   # the default strategy uses the drafter
    gamma_max: int                  # drafts per round at most (0: nothing speculative is exact here)
    free_guess: bool                # a plain step's lookup guess rides in its padded row
    source: str                     # "profile" or "export"
    plain_steps: str = "exact"      # without the drafter: "fast" runs unpadded 1-token steps, no lookup
    acceptance: float | None = None
    rates: dict = field(default_factory=dict)     # {(graph, gamma): expected tokens per second}
    reasons: tuple[str, ...] = ()
    threads: int | None = None      # the target's intra-op threads the profile chose (None: the default)
    draft_threads: int | None = None

    @property
    def graph_file(self) -> str:
        return GRAPH_WORDS[self.step_graph]

    def describe(self) -> str:
        """One line: the plan in words."""
        if self.gamma_max == 0:
            what = "plain 1-token steps only (no exact speculation on this machine)"
        elif self.plain_steps == "fast" and not self.drafter:
            return (f"plan ({self.source}): plain 1-token steps on {self.graph_file} (the target's own decoding: "
                    "faster here than padded steps with lookup guesses); no drafter")
        elif self.drafter:
            what = f"speculative with the drafter, gamma 1..{self.gamma_max}"
        else:
            what = "plain decoding with lookup guesses" + (" (free, in the padded row)" if self.free_guess else "")
        step = "1-token" if self.step_tokens == 1 else "padded 2-token"
        return f"plan ({self.source}): {what}; exact steps on {self.graph_file} ({step} forwards)"


def tau(alpha: float, gamma: int) -> float:
    """Expected tokens a round of `gamma` drafts commits at per-position acceptance alpha."""
    if alpha >= 1.0:
        return float(gamma + 1)
    return (1.0 - alpha ** (gamma + 1)) / (1.0 - alpha)


def round_rate(cost: list[float], drafter_ms: float, alpha: float, gamma: int, fill_ms: float = 0.0) -> float:
    """Expected tokens per second of rounds of `gamma` drafts (the module docstring's rate(gamma)), with
    `fill_ms` of the drafter's window fill per token."""
    return 1000.0 / ((gamma * drafter_ms + cost[gamma]) / tau(alpha, gamma) + fill_ms)


def gamma_range(cost: list[float], drafter_ms: float, alpha: float, max_gamma: int = MAX_GAMMA) -> int:
    """The longest draft whose rate on paper is within GAMMA_SLACK of the best, at acceptance alpha: the
    governor (runtime/round/governor.py) chooses inside 1..this per round (the fill does not depend on gamma,
    so it is left out here). The caller passes at least the prior: the lifetime acceptance averages
    prompts whose drafts are accepted far more often than others, and a range cut to the average holds
    those back (docs/results.md)."""
    rates = {g: round_rate(cost, drafter_ms, alpha, g) for g in range(1, min(max_gamma, len(cost) - 1) + 1)}
    top = max(rates.values())
    return max(g for g, r in rates.items() if r >= GAMMA_SLACK * top)


def export_plan(padded_exact_at_export: bool, min_forward_tokens: int, has_padded: bool,
                max_gamma: int = MAX_GAMMA, cpu: bool = True) -> Plan:
    """The plan without a profile: what the export measured on its own machine decides. Off the CPU EP
    (`cpu` False) the drafter waits for the profile: on a GPU at batch 1 a step is bound by kernel
    launches, so a small drafter's step costs nearly a target step (0.75-0.79 of one on an H200,
    docs/gpu.md) and drafting loses until the profile says otherwise."""
    padded = has_padded and padded_exact_at_export
    tokens = 1 if padded else max(1, int(min_forward_tokens))
    reasons = ("no device profile of this machine yet: the export's checks choose the graph",)
    if not cpu:
        reasons += ("not the CPU EP: no drafter before this EP's profile says it pays",)
    return Plan(step_graph="padded_attention" if padded else "model", step_tokens=tokens, drafter=cpu,
                gamma_max=max_gamma, free_guess=tokens >= 2, source="export", reasons=reasons)


def _step(g) -> tuple[int, float] | None:
    """(width, ms) of an exact plain step on a graph profile, None where no step is exact there."""
    if not g.measured or not g.wide_exact or len(g.cost_ms) < 2:
        return None
    k = 1 if g.one_token_exact else 2
    return k, g.cost_ms[k - 1]


def make_plan(profile, acceptance: float | None = None, max_gamma: int = MAX_GAMMA, graph: str | None = None,
              margin: float = DRAFTER_MARGIN, lookup_kept: float | None = None, fill_ms: float = 0.0) -> Plan:
    """The plan for `profile` (a device_profile.DeviceProfile, or anything with `.graphs` and
    `.drafter_step_ms`) at per-position acceptance `acceptance` (None: PRIOR_ACCEPTANCE). `graph`: only
    that graph variant may run the steps (a decoder whose target session exists re-plans on it).
    `margin`: what the drafter must beat plain decoding by on paper (KEEP_MARGIN for one that runs).
    `lookup_kept`: the share of padded plain steps whose lookup guess is kept (None: LOOKUP_PRIOR).
    `fill_ms`: the drafter's window fill per committed token (f in the module docstring)."""
    alpha = PRIOR_ACCEPTANCE if acceptance is None else min(max(float(acceptance), 0.0), 1.0)
    kept = LOOKUP_PRIOR if lookup_kept is None else min(max(float(lookup_kept), 0.0), 1.0)
    reasons: list[str] = []
    chosen = _threads(profile, reasons)
    for name, g in profile.graphs.items():
        word = GRAPH_WORDS.get(name, name)
        if not g.measured:
            reasons.append(f"{word}: {g.note or 'not measured'}")
        elif not g.wide_exact:
            reasons.append(f"{word}: forwards of 2+ tokens disagree here (max |diff| {g.wide_max_abs_diff:.3g}): "
                           "no exact speculation on it")
        elif not g.one_token_exact:
            reasons.append(f"{word}: 1-token forwards differ from wider ones here (max |diff| "
                           f"{g.one_token_max_abs_diff:.3g}): its exact steps are padded to 2 tokens")
        else:
            reasons.append(f"{word}: every width computes the same logits here")
    steps = {name: s for name, g in profile.graphs.items()
             if (graph is None or name == graph) and (s := _step(g)) is not None}
    if not steps:
        reasons.append("no graph computes the same logits for every forward width here: plain 1-token steps")
        return Plan("model", 1, drafter=False, gamma_max=0, free_guess=False, source="profile", acceptance=alpha,
                    reasons=tuple(reasons), **chosen)
    # plain decoding per graph: padded steps with free lookup guesses, or unpadded 1-token steps
    padded = {name: 1000.0 * (1.0 + kept if k >= 2 else 1.0) / ms for name, (k, ms) in steps.items()}
    fast = {name: 1000.0 / profile.graphs[name].cost_ms[0] for name, (k, _) in steps.items() if k >= 2}
    plain = {name: max(padded[name], fast.get(name, 0.0)) for name in steps}
    rates = {(name, 0): r for name, r in padded.items()}
    rates.update({(name, "1-token"): r for name, r in fast.items()})
    d = profile.drafter_step_ms
    spec: dict[tuple[str, int], float] = {}
    if d is not None:
        for name in steps:
            cost = profile.graphs[name].cost_ms
            for gamma in range(1, min(max_gamma, len(cost) - 1) + 1):
                spec[(name, gamma)] = round_rate(cost, d, alpha, gamma, fill_ms)
        rates.update(spec)
    best_plain = max(plain, key=plain.get)
    plain_steps = "fast" if fast.get(best_plain, 0.0) > padded[best_plain] else "exact"
    best_spec = max(spec, key=spec.get) if spec else None
    fmt = lambda key: f"{rates[key]:.1f} tok/s"      # noqa: E731 - one format for the reasons
    if plain_steps == "fast":
        reasons.append(f"fastest plain decoding: {GRAPH_WORDS[best_plain]} with unpadded 1-token steps, "
                       f"{fmt((best_plain, '1-token'))} (padded steps with lookup guesses kept {kept:.2f} of the "
                       f"time: {fmt((best_plain, 0))})")
    else:
        reasons.append(f"fastest exact plain decoding: {GRAPH_WORDS[best_plain]}, {fmt((best_plain, 0))}")
    if d is None:
        reasons.append("no drafter in this bundle")
    elif best_spec is not None:
        gain = spec[best_spec] / plain[best_plain]
        reasons.append(f"best speculative round at acceptance {alpha:.2f}: {GRAPH_WORDS[best_spec[0]]} gamma "
                       f"{best_spec[1]}, {fmt(best_spec)} ({gain:.2f}x plain; the drafter starts from "
                       f"{DRAFTER_MARGIN:.2f}x and runs down to {KEEP_MARGIN:.2f}x; drafter step {d:.1f} ms, its fill "
                       f"{fill_ms:.1f} ms a token)")
    if best_spec is not None and spec[best_spec] >= margin * plain[best_plain]:
        graph = best_spec[0]
        gamma_max = gamma_range(profile.graphs[graph].cost_ms, d, max(alpha, PRIOR_ACCEPTANCE), max_gamma)
        tokens = steps[graph][0]
        return Plan(graph, tokens, drafter=True, gamma_max=gamma_max, free_guess=tokens >= 2, source="profile",
                    acceptance=alpha, rates=rates, reasons=tuple(reasons), **chosen)
    tokens = steps[best_plain][0]
    if d is not None:
        how = "unpadded 1-token steps" if plain_steps == "fast" else "plain decoding with lookup guesses"
        reasons.append(f"the drafter does not pay here: {how}, no drafter")
    return Plan(best_plain, tokens, drafter=False, gamma_max=max_gamma, free_guess=tokens >= 2, source="profile",
                plain_steps=plain_steps, acceptance=alpha, rates=rates, reasons=tuple(reasons), **chosen)


def _threads(profile, reasons: list[str]) -> dict:
    """{"threads", "draft_threads"} the profile's thread scaling chose (None where it has none), with a
    reason naming them."""
    scaling = getattr(profile, "thread_scaling", None) or {}
    chosen = {"threads": scaling.get("target_threads"), "draft_threads": scaling.get("drafter_threads")}
    for side, key in (("target", "threads"), ("drafter", "draft_threads")):
        if chosen[key] is not None:
            steps = ", ".join(f"{n}: {ms:.1f} ms" for n, ms in sorted(scaling[side].items()))
            reasons.append(f"{side} threads {chosen[key]}, its fastest step by thread count ({steps})")
    return chosen
