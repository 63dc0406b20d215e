"""The records that carry one generation's decisions and results between the decoder, the round and the
planning (runtime/planning/device_plan.py), so that none of them reads another's state:

- `StepPlan`: how this generation's target steps run, decided once when it starts from the decoder's
  plan (runtime/planning/plan.py) and its variant's config. The round (rounds.py), the generation
  (generation.py) and the planning read it; nothing else decides these.
- `GenerationRecord`: what a finished generation hands the planning: its stats, its ids, its step plan
  and the acceptance of its drafter rounds.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from edgespec.runtime.planning.plan import MAX_GAMMA


@dataclass(frozen=True)
class StepPlan:
    exact_width: int = 1            # an exact target forward is at least this wide (2: a 1-token step is padded)
    plain_pads: bool = True         # plain steps are exact (padded to exact_width), not the target's own 1-token steps
    plain_guess: bool = False       # plain steps may carry a prompt-lookup guess (rounds.plain_step)
    drafter_gamma: int | None = None    # the plan's bound on drafter rounds (None: the config's draft length)
    verify_ms: tuple[float, ...] = ()   # the device profile's k-token forward costs on the step graph (k = 1..)

    @property
    def free_guess(self) -> bool:
        """A plain step's guess rides in the padded row: it costs nothing."""
        return self.plain_pads and self.exact_width >= 2

    @property
    def unpadded(self) -> bool:
        """Plain steps run narrower than exact forwards: their KV differs from a cold prefill's, and their
        forwards are not the profile's (padded) widths."""
        return not self.plain_pads and self.exact_width >= 2

    def pads(self, drafts: int) -> bool:
        """Whether a verify forward of `drafts` drafts pads to exact_width (every draft is verified exactly;
        a plain step as the plan says)."""
        return drafts > 0 or self.plain_pads


def step_plan(plan, config, exact_width: int, auto: bool, verify_ms=()) -> StepPlan:
    """The step plan of a generation of `config` (config.DecodeConfig) under the decoder's `plan`
    (plan.Plan), on a target runner whose exact forwards are `exact_width` wide. `auto`: the decoder's
    strategy is "auto", whose drafter rounds keep to the plan's gamma range (rated up to MAX_GAMMA
    drafts: a caller's max_draft_length above that is honoured, not capped)."""
    guess = config.plain_guess and config.strategy.speculative and config.draft_probability is None
    bound = None
    if auto and config.strategy.uses_drafter and config.auto_length:
        bound = max(plan.gamma_max, 1) if config.gamma <= MAX_GAMMA else config.gamma
    return StepPlan(exact_width=int(exact_width), plain_pads=config.plain_steps == "exact", plain_guess=guess,
                    drafter_gamma=bound, verify_ms=tuple(verify_ms))


@dataclass
class GenerationRecord:
    stats: object                   # stats.GenerationStats
    prompt_ids: list[int]
    output_ids: list[int]
    step: StepPlan = field(default_factory=StepPlan)
    drafter_reached: int = 0        # draft positions the drafter's rounds reached (up to the first rejection)
    drafter_accepted: int = 0       # ... and of those, accepted
