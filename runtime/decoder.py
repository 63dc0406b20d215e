"""`SpeculativeDecoder`: the decode loop (gpt-fast / mlx-lm style) over two ORT sessions.

One round (`Generation.token_round`), for every token-level strategy (ar, sd, tli, and later rdk...):
1. draft: up to gamma drafter forwards, each fed the drafter tokens not yet in its KV cache; the
   strategy turns the last row of kept-column logits into q over target ids; a draft is sampled
   (argmax at temperature 0);
2. verify: ONE target forward over [last committed token, d_1..d_n] -> n+1 rows of logits;
   verify.py accepts a prefix and emits one more token (correction or bonus);
3. roll back: both KV caches are cropped by slicing (kv.py); the drafter catches up on the emitted
   token at its next forward (together with d_n after a full accept).
`ar` is the same round with gamma = 0 and no drafter. State between rounds: the target's KV covers
every committed token except `last`, which is fed first in the next verify forward.

Stopping: EOS (any of the target's eos_ids; the EOS token is kept in token_ids, not in text), stop
strings (text ends before the stop string; token_ids end with the token that completed it),
max_new_tokens (never exceeded: a round drafts at most remaining - 1 tokens). A prompt that cannot
fit prompt + max_new_tokens in the target's context is refused before anything runs.
"""
from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np

from edgespec.errors import BundleError, GenerationError
from edgespec.runtime.bundle import Bundle
from edgespec.runtime.chat import as_messages, render_chat
from edgespec.runtime.context import drafter_context
from edgespec.runtime.kv import ModelRunner
from edgespec.runtime.sampling import SamplingParams, make_rng, probabilities, sample
from edgespec.runtime.sessions import create_session
from edgespec.runtime.stats import GenerationStats
from edgespec.runtime.strategies import get_strategy
from edgespec.runtime.text import TextState
from edgespec.runtime.verify import verify_greedy, verify_sampled

@dataclass
class GenerationResult:
    text: str
    token_ids: list[int]
    stats: GenerationStats
    prompt_token_ids: list[int] = field(default_factory=list)


class SpeculativeDecoder:
    """Speculative decoding over an edgespec bundle. See docs/architecture.md for the API."""

    def __init__(self, bundle: Bundle | str | Path, strategy: str = "tli", draft_length: int = 4, ep="cpu",
                 draft_ep=None, threads: int | None = None, allow_fallback: bool = False,
                 draft_probability: float | str | None = None, draft_threads: int | None = None,
                 **strategy_options):
        if not isinstance(bundle, Bundle):
            bundle = Bundle.load(bundle)
        self.bundle = bundle
        strat = get_strategy(strategy)
        _check_draft_length(draft_length)
        tinfo = bundle.target.info
        sess, self.target_session_info = create_session(bundle.target.onnx, ep, threads, allow_fallback, "target")
        self.target = ModelRunner(sess, "target", int(tinfo.get("max_position") or 0) or None)
        self._check_runner(self.target, tinfo, bundle.target.vocab_size, "target")
        self.drafter = None
        self.drafter_session_info = None
        self.ctx = None
        if strat.uses_drafter:
            if strat.check:      # refuse before paying for the drafter session
                strat.check(bundle, dict(strategy_options))
            dinfo = bundle.drafter.info
            sess, self.drafter_session_info = create_session(
                bundle.drafter.onnx, ep if draft_ep is None else draft_ep,
                threads if draft_threads is None else draft_threads, allow_fallback, "drafter")
            self.drafter = ModelRunner(sess, "drafter", int(dinfo.get("max_position") or 0) or None, exact=False)
            self._check_runner(self.drafter, dinfo, bundle.kept, "drafter")
            self._check_constant_outputs()
            self.ctx = drafter_context(bundle)          # token tables: built once per decoder
        self.eos_ids = frozenset(bundle.target.eos_ids)
        self._shared = _Shared()
        self._configure(strat, draft_length, draft_probability, strategy_options)

    def _configure(self, strat, draft_length, draft_probability, options) -> None:
        """Per-strategy settings (everything that is not a session)."""
        _check_draft_length(draft_length)
        if strat.uses_drafter and self.drafter is None:
            raise GenerationError(f"strategy {strat.name!r} needs a drafter session; this decoder was created "
                                  "with 'ar' and has none")
        self.strategy = strat
        self.draft_length = int(draft_length) if strat.uses_drafter else 0
        self.draft_probability = self._check_draft_probability(draft_probability)
        self.options = dict(options)
        if strat.check:
            strat.check(self.bundle, self.options)
        self.state = strat.prepare(self.bundle, self.options)
        v, g = self.bundle.target.vocab_size, self.draft_length
        self.q_rows = np.zeros((g + 1, v), dtype=np.float64)   # draft distributions of one round
        self.p_rows = np.zeros((g + 1, v), dtype=np.float64)   # target distributions of one round
        self.work = np.zeros((2, v), dtype=np.float64)         # residual + CDF scratch (verify, draws)
        self.last_result: GenerationResult | None = None
        self._last_generation: Generation | None = None

    def variant(self, strategy: str | None = None, draft_length: int | None = None,
                draft_probability: float | str | None = None, **strategy_options) -> "SpeculativeDecoder":
        """Another strategy / draft length on the SAME sessions, KV runners and token tables (no new
        session; only the per-round scratch arrays are new). Generations of a decoder and its variants must not interleave: a
        newer call supersedes an unfinished stream of any of them."""
        new = copy.copy(self)
        strat = get_strategy(strategy) if strategy is not None else self.strategy
        new._configure(strat, self.draft_length or 1 if draft_length is None else draft_length,
                       draft_probability, strategy_options)
        if not strat.uses_drafter:
            new.drafter, new.drafter_session_info, new.ctx = None, None, None
        return new

    # ------------------------------------------------------------------ checks
    def _check_draft_probability(self, a):
        if a is None:
            return None
        if a == "auto":
            a = self.bundle.a_star
            if a is None:
                raise GenerationError("draft_probability='auto' needs a calibrated a* in the bundle (vocab/randomised.json)")
        if isinstance(a, bool) or not isinstance(a, (int, float)) or not 0.0 < float(a) <= 1.0:
            raise GenerationError(f"draft_probability must be in (0, 1] or 'auto', got {a!r}")
        if not self.strategy.uses_drafter:
            raise GenerationError("draft_probability needs a drafting strategy (not 'ar')")
        return float(a)

    def _check_runner(self, runner: ModelRunner, info: dict, width: int, role: str) -> None:
        if isinstance(runner.vocab, int) and runner.vocab != width:
            raise BundleError(f"bundle {self.bundle.path}: {role} graph emits {runner.vocab} logits, manifest expects {width}")
        layers = info.get("num_layers")
        if layers and len(runner.past_names) != 2 * int(layers):
            raise BundleError(f"bundle {self.bundle.path}: {role} graph has {len(runner.past_names)} past inputs, "
                              f"manifest says {layers} layers")

    def _check_constant_outputs(self) -> None:
        names = [n for n in ("index_map", "draft_ids") if n in self.drafter.extra_outputs]
        if not names:
            return
        for name, arr in zip(names, self.drafter.run_extra(names)):
            if not np.array_equal(np.asarray(arr).reshape(-1), getattr(self.bundle, name)):
                raise BundleError(f"bundle {self.bundle.path}: the drafter graph's {name} differs from vocab/{name}.npy "
                                  "(mismatched bundle)")

    @property
    def providers(self) -> dict:
        out = {"target": list(self.target_session_info.active)}
        if self.drafter_session_info:
            out["drafter"] = list(self.drafter_session_info.active)
        return out

    # ------------------------------------------------------------------ prompts
    def encode_prompt(self, prompt, chat: bool = False) -> list[int]:
        """Target token ids for a str prompt (or chat messages), or a validated list of ids."""
        tok = self.bundle.target.tokenizer
        if chat:
            b = self.bundle.target
            bos = tok.id_to_token(b.bos_id) if b.bos_id is not None else ""
            eos = tok.id_to_token(b.eos_ids[0]) if b.eos_ids else ""
            text = render_chat(self.bundle.chat_template, as_messages(prompt), bos_token=bos or "", eos_token=eos or "")
            ids = tok.encode(text, add_special_tokens=False).ids
        elif isinstance(prompt, str):
            if not prompt:
                raise GenerationError("empty prompt")
            ids = tok.encode(prompt, add_special_tokens=True).ids
        elif isinstance(prompt, (list, tuple, np.ndarray)):
            ids = [int(i) for i in prompt]
            bad = [i for i in ids if not 0 <= i < self.bundle.target.vocab_size]
            if bad:
                raise GenerationError(f"prompt token ids out of range [0, {self.bundle.target.vocab_size}): {bad[:5]}")
        else:
            raise GenerationError(f"prompt must be a str or a list of token ids, got {type(prompt).__name__}")
        if not ids:
            raise GenerationError("empty prompt")
        return ids

    # ------------------------------------------------------------------ public API
    def generate(self, prompt, max_new_tokens: int = 128, temperature: float = 0.0, top_k: int | None = None,
                 top_p: float | None = None, seed: int | None = None, stop: str | Sequence[str] | None = None,
                 chat: bool = False) -> GenerationResult:
        run = self._run(prompt, max_new_tokens, temperature, top_k, top_p, seed, stop, chat, incremental=False)
        for _ in run:
            pass
        return self.last_result

    def stream(self, prompt, max_new_tokens: int = 128, temperature: float = 0.0, top_k: int | None = None,
               top_p: float | None = None, seed: int | None = None, stop: str | Sequence[str] | None = None,
               chat: bool = False) -> Iterator[str]:
        """Text deltas (each a valid str; their concatenation is the result's text). The full result,
        stats included, is in `self.last_result` once the generator ends or is closed. Arguments are
        checked when this is called, not at the first `next()`."""
        run = self._run(prompt, max_new_tokens, temperature, top_k, top_p, seed, stop, chat)
        next(run)  # runs the argument checks now; the first yield carries no text
        return run

    # ------------------------------------------------------------------ the loop
    def _run(self, prompt, max_new_tokens, temperature, top_k, top_p, seed, stop, chat, incremental=True):
        """The generator behind generate() and stream(). With incremental=False (generate without stop
        strings) the text is decoded once at the end instead of after every round."""
        t_start = time.perf_counter()
        params = SamplingParams(temperature=float(temperature) if temperature is not None else temperature,
                                top_k=top_k, top_p=top_p)
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, (int, np.integer)) or max_new_tokens < 1:
            raise GenerationError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")
        stops = _stop_strings(stop)
        prompt_ids = self.encode_prompt(prompt, chat)
        limit = self.target.max_position
        if limit and len(prompt_ids) + max_new_tokens > limit:
            raise GenerationError(f"prompt ({len(prompt_ids)} tokens) + max_new_tokens ({max_new_tokens}) exceeds the "
                                  f"target's context length {limit}")
        self._shared.generation += 1
        gen = Generation(self, prompt_ids, params, make_rng(seed), int(max_new_tokens))
        self._last_generation = gen          # for debugging and the profiler
        gen.stats.fallbacks = [i.fallback for i in (self.target_session_info, self.drafter_session_info)
                               if i is not None and i.fallback]
        text_state = TextState(self.bundle.target.tokenizer, stops)
        reason = "interrupted"
        yield ""
        try:
            new = gen.prefill()
            gen.stats.ttft_ms = (time.perf_counter() - t_start) * 1e3
            while True:
                reason = gen.commit(new)
                if incremental or stops or reason is not None:
                    reason = text_state.update(gen.generated, reason) or reason
                if text_state.stopped_at is not None:
                    del gen.generated[text_state.stopped_at:]
                delta = text_state.take(final=reason is not None)
                if delta:
                    yield delta
                if reason is not None:
                    break
                new = gen.round()
        finally:
            st = gen.stats
            st.total_ms = (time.perf_counter() - t_start) * 1e3
            st.new_tokens = len(gen.generated)
            st.prefill_tokens = min(1, st.new_tokens)
            st.stop_reason = reason or "interrupted"
            st.drafter_resyncs = gen.ctx.resyncs if gen.ctx is not None else 0
            if gen.id == self._shared.generation:   # a superseded stream must not overwrite a newer result
                    self.last_result = GenerationResult(
                    text=text_state.emitted if reason is None else text_state.final_text,
                    token_ids=list(gen.generated), stats=st, prompt_token_ids=prompt_ids)


class Generation:
    """Mutable state of one generate/stream call (also the seam for custom rounds, e.g. SLEM):
    - `target`: its KV covers prompt + generated[:-1]; `last` (= generated[-1]) is fed next;
    - `drafter`/`ctx`: the drafter's KV covers ctx.ids[:drafter.length]; ctx.ids is the committed text
      in drafter tokens (context.py);
    - `generated`: committed target ids; `stats`, `params`, `rng`."""

    def __init__(self, dec: SpeculativeDecoder, prompt_ids: list[int], params: SamplingParams,
                 rng: np.random.Generator, max_new_tokens: int):
        self.dec = dec
        self.prompt_ids = prompt_ids
        self.params = params
        self.rng = rng
        self.max_new_tokens = max_new_tokens
        self.target = dec.target
        self.drafter = dec.drafter
        self.ctx = dec.ctx
        self.generated: list[int] = []
        self.last = -1
        self.id = dec._shared.generation
        self.stats = GenerationStats(strategy=dec.strategy.name, draft_length=dec.draft_length,
                                     prompt_tokens=len(prompt_ids), providers=dec.providers)

    # ------------------------------------------------------------------ helpers
    def _check_current(self) -> None:
        if self.id != self.dec._shared.generation:
            raise GenerationError("this stream was superseded by a newer generate/stream call on the same decoder")

    def pick(self, logits_row: np.ndarray) -> int:
        """A token from one row of target logits (argmax, or a draw from p)."""
        if self.params.greedy:
            return int(np.argmax(logits_row))
        p = probabilities(logits_row[None, :], self.params, out=self.dec.p_rows[:1])
        return sample(p[0], self.rng, self.dec.work[1])

    def draft_forward(self, ids: list[int]) -> np.ndarray:
        """Drafter forward on `ids`; returns the last row of kept-column logits and books the time."""
        was_prefill = self.drafter.length == 0
        row = self.drafter.forward(ids)[-1]
        ms = self.drafter.last_ms
        st = self.stats
        st.draft_forwards += 1
        if was_prefill:
            st.prefill_ms += ms
        else:
            st.draft_ms += ms
            st.draft_ms_steps.append(ms)
        return row

    def draft_q(self, row: np.ndarray, j: int) -> np.ndarray:
        """The strategy's draft distribution over target ids for one drafter row, into q_rows[j]."""
        t = time.perf_counter()
        q = self.dec.strategy.distribution(self.dec.state, row, self.params, self.dec.q_rows[j])
        self.stats.sampler_ms += (time.perf_counter() - t) * 1e3
        return q

    def draft_greedy(self, row: np.ndarray) -> int:
        """The strategy's temperature-0 draft (a target id) for one drafter row."""
        t = time.perf_counter()
        x = self.dec.strategy.greedy(self.dec.state, row)
        self.stats.sampler_ms += (time.perf_counter() - t) * 1e3
        return x

    def commit(self, new: list[int]) -> str | None:
        """Append committed tokens; returns "eos"/"length" when generation must end."""
        for i, t in enumerate(new):
            if t in self.dec.eos_ids:
                self.generated.extend(new[:i + 1])
                return "eos"
        self.generated.extend(new)
        return "length" if len(self.generated) >= self.max_new_tokens else None

    # ------------------------------------------------------------------ phases
    def prefill(self) -> list[int]:
        self._check_current()
        self.target.reset()
        self.target.reserve(len(self.prompt_ids) + self.max_new_tokens + self.dec.draft_length + 2)
        logits = self.target.forward(self.prompt_ids)[-1]
        self.stats.prefill_ms += self.target.last_ms
        self.stats.target_forwards += 1
        self.last = self.pick(logits)
        if self.drafter is not None:
            self.drafter.reset()
            self.ctx.start(self.prompt_ids)
            self.ctx.append_target(self.last)
        return [self.last]

    def round(self) -> list[int]:
        self._check_current()
        remaining = self.max_new_tokens - len(self.generated)
        gamma = min(self.dec.draft_length, remaining - 1)
        if gamma > 0 and not self.ctx.ids:      # nothing the drafter can condition on (no BOS, only unmapped specials)
            gamma = 0
        if gamma > 0 and self.drafter.max_position:
            room = self.drafter.max_position - len(self.ctx.ids) - 2
            if room < gamma:
                gamma = max(room, 0)
                self.stats.drafter_fallback_steps += gamma == 0
        custom = self.dec.strategy.round
        if (custom is None and self.dec.draft_probability is not None and not self.params.greedy
                and self.dec.options.get("concurrent_draft", True)):
            from edgespec.runtime.randomised import randomised_round   # no-draft forward on a worker thread
            custom = randomised_round
        return custom(self, gamma) if custom is not None and gamma > 0 else self.token_round(gamma)

    def token_round(self, gamma: int) -> list[int]:
        dec, st, params, rng = self.dec, self.stats, self.params, self.rng
        ctx = self.ctx
        a = dec.draft_probability
        drafts: list[int] = []
        marks: list[int] = []            # len(ctx.ids) before each draft's drafter ids
        terminal = False                 # randomised drafting: the block ends on a "no draft" position
        for j in range(gamma):
            if self.drafter.length == len(ctx.ids):   # nothing new (an emitted special had no drafter id):
                self.drafter.crop(self.drafter.length - 1)   # re-run the last token for fresh logits
            row = self.draft_forward(ctx.ids[self.drafter.length:])
            if params.greedy:
                x = self.draft_greedy(row)
            else:
                q = self.draft_q(row, j)
                if a is not None and rng.random() >= a:
                    terminal = True
                    break
                x = sample(q, rng, dec.work[1])
            drafts.append(x)
            marks.append(len(ctx.ids))
            ctx.ids.extend(ctx.feed_ids(x))
        n = len(drafts)
        logits = self.target.forward([self.last, *drafts])
        st.record_verify(n + 1, self.target.last_ms)
        d = np.asarray(drafts, dtype=np.int64)
        if params.greedy:
            n_acc, t = verify_greedy(logits, d)
        else:
            p = probabilities(logits, params, out=dec.p_rows[:n + 1])
            n_acc, t = verify_sampled(p, dec.q_rows[:n + terminal], d, rng, 1.0 if a is None else a, terminal,
                                      work=dec.work)
        self.target.crop(self.target.length - (n - n_acc))
        if ctx is not None:
            if n_acc < n:
                del ctx.ids[marks[n_acc]:]
            changed = ctx.append_target(t)
            self.drafter.crop(min(self.drafter.length, changed))
        st.record_block(n, n_acc)
        self.last = t
        return [*drafts[:n_acc], t]


class _Shared:
    """State shared by a decoder and its variants (they share runners)."""
    generation = 0


def _check_draft_length(k) -> None:
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise GenerationError(f"draft_length must be an integer >= 1, got {k!r}")


def _stop_strings(stop) -> list[str]:
    if stop is None:
        return []
    items = [stop] if isinstance(stop, str) else list(stop)
    if not all(isinstance(s, str) and s for s in items):
        raise GenerationError("stop must be a non-empty string or a list of non-empty strings")
    return items
