"""What a generation needs besides its own state, in two explicit objects (generation.Generation reads these,
never the decoder):

- `Shared`: what outlives one generation and is shared by a decoder and all its variants: the KV runners,
  the drafter's token tables, the prefix cache, the answer store (earlier requests' answers, which draft
  for later ones: answer_store.py), the worker thread for drafter forwards beside the verify, the
  generation counter and the lock that serialises calls;
- `Setup`: one variant's: its checked config, what its strategy precomputed once (`Strategy.prepare`),
  its draft-length governors and its per-round arrays.
"""
from __future__ import annotations

import threading

import numpy as np

from edgespec.errors import GenerationError
from edgespec.runtime.samplers.answer_store import DEFAULT_STORE_MB, AnswerStore
from edgespec.runtime.round.governor import Governor
from edgespec.runtime.engine.prefix import PrefixCache
from edgespec.runtime.round.randomised import SideRunner


class Shared:
    def __init__(self, bundle, target, drafter=None, text_context=None, target_session_info=None,
                 answer_store_mb: float = DEFAULT_STORE_MB):
        self.bundle = bundle
        self.target = target                   # kv.ModelRunner
        self.drafter = drafter                 # kv.ModelRunner or kv.DeferredRunner, None without one
        self.text_context = text_context       # context.TextContext: the pair's token tables
        self.target_session_info = target_session_info
        self.eos_ids = frozenset(bundle.target.eos_ids)
        self.prefix = PrefixCache()            # what the runners' KV holds (prefix reuse)
        self.answers = AnswerStore(int(answer_store_mb * 2**20))   # completed generations (Generation.finish)
        self.generation = 0                    # number of the newest generation
        self.grammar_tokenizer = None          # grammar.start_constraint's, built at the first constrained call
        self.lock = threading.Lock()           # calls on a decoder and its variants run one at a time
        self._side_runner: SideRunner | None = None

    def side_runner(self) -> SideRunner:
        """The worker thread for drafter forwards that run beside the verify (created on first use)."""
        if self._side_runner is None:
            self._side_runner = SideRunner()
        return self._side_runner

    def close(self) -> None:
        """Stop the worker thread, if one was started (a later generation starts a new one)."""
        side, self._side_runner = self._side_runner, None
        if side is not None:
            side.close()

    def drafter_session_info(self):
        """The drafter session's SessionInfo (None: no drafter, or one not built yet)."""
        d = self.drafter
        return None if d is None or d.pending else d.session_info

    def providers(self, with_drafter: bool) -> dict:
        """The EPs each session runs on: {"target": [...], "drafter": [...]}."""
        out = {"target": list(self.target_session_info.active)}
        if with_drafter and self.drafter is not None:
            out["drafter"] = list(self.drafter.providers if self.drafter.pending else
                                  self.drafter_session_info().active)
        return out


class Setup:
    @classmethod
    def for_config(cls, bundle, shared: Shared, config) -> "Setup":
        """A checked config's Setup on a decoder's `shared` sessions (config.checked_config)."""
        strat = config.strategy
        if strat.uses_drafter and shared.drafter is None:
            raise GenerationError(f"strategy {strat.name!r} needs a drafter session; this decoder was created "
                                  "with 'ar' and has none")
        return cls(config, strat.prepare(bundle, dict(config.options)), bundle.target.vocab_size)

    def __init__(self, config, prepared, vocab_size: int):
        self.config = config                   # config.DecodeConfig, resolved for the bundle
        self.prepared = prepared               # Strategy.prepare's tables
        self.governor = Governor(config.gamma) if config.auto_length else None
        self.source_governors: dict[str, Governor] = {}      # per proposer (Strategy.source), made on first use
        g = config.gamma
        self.scratch = (np.zeros((g + 1, vocab_size), dtype=np.float64),   # draft distributions of one round
                        np.zeros((g + 1, vocab_size), dtype=np.float64),   # target distributions of one round
                        np.zeros((2, vocab_size), dtype=np.float64))       # residual + CDF scratch (verify, draws)

    @property
    def uses_drafter(self) -> bool:
        return self.config.strategy.uses_drafter

    def governor_for(self, source: str | None) -> Governor | None:
        """The draft-length governor of a round from `source` (None: the strategy's only proposer)."""
        if self.governor is None or source is None:
            return self.governor
        if source not in self.source_governors:
            self.source_governors[source] = Governor(self.governor.gamma_max)
        return self.source_governors[source]

    def drafter_governor(self) -> Governor | None:
        """The governor of this variant's drafter rounds (None: it runs no drafter, or not by length)."""
        if not self.uses_drafter:
            return None
        return self.governor_for("drafter" if self.config.strategy.source else None)
