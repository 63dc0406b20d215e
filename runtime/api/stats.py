"""Per-generation statistics (`GenerationResult.stats`). Every field and its convention:

Counts
- `new_tokens`: tokens generated (returned in `token_ids`), including an EOS token that ended the
  generation; never more than max_new_tokens. With a stop string, tokens after the one that completed
  it are not counted (none are generated past it).
- `prompt_tokens`: target tokens in the prompt (after the chat template and BOS handling).
- `reused_tokens`: prompt tokens whose target KV was kept from the previous call (prefix reuse:
  runtime/engine/prefix.py); the prefill ran the other prompt_tokens - reused_tokens.
- `target_forwards`: target ORT runs, prefill included (= 1 + verify_forwards).
- `verify_forwards`: target runs after the prefill. For `ar` each is a 1-token decode step.
- `draft_forwards`: drafter ORT runs, its prefill included (the drafter prefill is the first drafter
  run; with a heterogeneous drafter a resync may feed several tokens in one run, still one forward).
- `drafted`: draft tokens proposed to the target (summed over verify forwards).
- `accepted`: draft tokens the target accepted. The token the target emits itself after the
  accepted drafts (the correction or the bonus token) is NOT counted in `accepted`.
- `guesses`, `guesses_accepted`: plain steps (gamma = 0) of a speculative strategy that carried a
  prompt-lookup guess (rounds.plain_step, `plain_guess`), and how many the target kept. Not in `drafted`/`accepted` (the strategy's own drafts) nor in the per-step lists (0 there);
  a kept guess is a committed token, so it is in `tau`.
- `store_drafted`, `store_accepted`: drafts (and guesses) that came from the decoder's answer store
  (earlier calls' answers: runtime/samplers/answer_store.py) and how many the target kept; a part of
  `drafted`/`accepted` (or of `guesses`/`guesses_accepted`), not more of them.
- `forced`, `forced_accepted`, `forced_rounds`: constrained decoding (runtime/samplers/grammar.py): tokens the
  grammar forced, drafted for free (rounds.forced_round: no drafter forward), how many the target kept,
  and the rounds that drafted them. Not in `drafted`/`accepted` (0 in the per-step lists); kept ones
  are in `tau`. `grammar_ms`: computing the grammar's token masks (part of `overhead_ms`), `grammar_masks`
  how many.
- `drafter_resyncs`: times the drafter context had to be rebuilt by re-tokenising committed text
  (a target token with no drafter counterpart); mapping through target->drafter does not count.
- `drafter_fallback_steps`: verify forwards run with no drafts because the drafter's own context
  would have exceeded its max_position (the loop then degrades to plain decoding).
- `slem_realignments`: `slem` rounds whose drafted text, re-tokenised for the target, did not line up
  with the committed tokens and was realigned (runtime/round/slem.py: merge across the boundary or a
  normalising, non-injective tokenizer).

Derived (properties)
- `acceptance_rate` = accepted / drafted (None when nothing was drafted, e.g. `ar`).
- `tau` = tokens committed by verify forwards / verify_forwards, i.e. (new_tokens - prefill_tokens)
  / verify_forwards; the prefill's first token is excluded. `ar` has tau = 1. Equals the mean
  "accepted + 1" per verify step (less at the very end, when a stop truncates a block).
- `tokens_per_s` = new_tokens / total time (prefill included).
- `decode_tokens_per_s` = (new_tokens - prefill_tokens) / (total time - ttft).
- `overhead_share` = overhead_ms / (total_ms - prefill_ms): the share of the decode phase spent
  outside ORT runs.

Times (ms, wall clock, time.perf_counter)
- `total_ms`: from the call (after argument checks) to the last token; tokenisation included.
- `ttft_ms`: from the call to the first generated token being available.
- `prefill_ms`: the target's prefill run (ORT time only): the prompt tokens it had to run, after any
  prefix reused from the previous call (`reused_tokens`).
- `draft_prefill_ms`: the drafter's fills of its context window (runtime/round/context.py DrafterWindow): the
  first, at the first drafting round (so after TTFT, inside the decode phase; after prefix reuse, the
  part of the window the reuse did not keep), and each later refill (`draft_refills`);
  `draft_prefill_tokens` drafter tokens in all. Its own field: never hidden in
  prefill_ms, draft_ms or TTFT.
- `draft_ms`: drafter ORT runs other than fills (drafting steps and catch-ups).
- `drafter_load_ms`: building the drafter's ORT session, in the generation that drafted first on a
  decoder that deferred it (SpeculativeDecoder(options={"defer_drafter": True}), the CPU EP's default): after TTFT,
  inside the decode phase (so in decode_tokens_per_s), once per decoder.
- `verify_ms`: target ORT runs after its prefill.
- `prefill_graph_load_ms`: building the target's prefill graph session and checking it, in the generation
  whose prompt first needed it on a decoder that deferred it (prefill_graph="auto"): before the first
  token, so inside `ttft_ms`, once per decoder.
- `overhead_ms` = total_ms - prefill_ms - draft_prefill_ms - draft_ms - verify_ms - drafter_load_ms
  - prefill_graph_load_ms + overlap_ms:
  everything that is not an ORT run (tokenisation, templates, sampling, strategies, verify arithmetic, KV slicing, text decoding).
- `sampler_ms`: NumPy time turning drafter logits into the draft (the strategy's distribution q over
  target ids, or its greedy pick): masking, TLI renormalisation, RDK's Taylor term or M^T q'. Part of
  overhead_ms. `sampler_share` = sampler_ms / draft_ms: the strategy's cost as a share of drafter time.
- `overlap_ms`: ORT time that ran at the same time as other ORT time, hence counted twice in
  prefill/draft/verify_ms: randomised drafting runs the no-draft drafter forward on a worker thread
  while the target verifies (runtime/round/randomised.py); per such round, drafter ms + verify ms - the
  round's wall time for the two. 0 otherwise.

Profiler hooks
- `verify_ms_by_k`: {k: [ms, ...]}: each target run after prefill, keyed by the number of tokens fed
  (k = drafts + 1). The verify-k / decode-1 ratio is median(verify_ms_by_k[k]) of a speculative run
  over median(verify_ms_by_k[1]) of an `ar` run.
- `draft_ms_steps`: each drafter run's ms after its prefill (in order).
- `accepted_per_step`: accepted drafts of each verify forward (in order); `drafted_per_step` likewise.
- `gamma_per_step`: the draft length chosen for each round (draft_length="auto": the governor's choice;
  a round may draft fewer: randomised coins, a confidence stop, a short n-gram match).
- `fallback_ms`: wall time of the whole rounds (verify forward, sampling, bookkeeping) that a
  speculative strategy ran with gamma = 0 (plain decoding: the governor's fallback, the end of the
  token budget, no room in the drafter's context, or nothing yet for the drafter to read).
- `zero_accept_share` (derived): share of drafting rounds that kept no draft.
- `acceptance_by_position` (derived): per draft position j, P(accepted | reached), reached = drafts
  before j all accepted and a draft j proposed.

Environment
- `providers`: {"target": [...], "drafter": [...]} as reported by session.get_providers().
- `fallbacks`: notes for each session whose requested EP was not active (allow_fallback=True).
- `stop_reason`: "eos", "stop" (a stop string), "length" (max_new_tokens), "interrupted"
  (a stream closed by the caller), or "error" (a GenerationError mid-generation: the output so far is
  the decoder's `last_result`).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass
class GenerationStats:
    strategy: str = ""
    draft_length: int | float = 0     # gamma; with draft_length="auto": the mean gamma chosen per round
    draft_length_setting: int | str = 0
    new_tokens: int = 0
    prompt_tokens: int = 0
    reused_tokens: int = 0
    prefill_tokens: int = 0          # tokens emitted straight from the target's prefill (1, or 0 if none)
    target_forwards: int = 0
    verify_forwards: int = 0
    draft_forwards: int = 0
    drafted: int = 0
    accepted: int = 0
    guesses: int = 0
    guesses_accepted: int = 0
    store_drafted: int = 0
    store_accepted: int = 0
    forced: int = 0
    forced_accepted: int = 0
    forced_rounds: int = 0
    grammar_ms: float = 0.0
    grammar_masks: int = 0
    drafter_resyncs: int = 0
    drafter_fallback_steps: int = 0
    slem_realignments: int = 0
    total_ms: float = 0.0
    ttft_ms: float = 0.0
    prefill_ms: float = 0.0
    draft_prefill_ms: float = 0.0
    draft_prefill_tokens: int = 0
    draft_refills: int = 0
    draft_ms: float = 0.0
    drafter_load_ms: float = 0.0
    prefill_graph_load_ms: float = 0.0
    verify_ms: float = 0.0
    overlap_ms: float = 0.0
    sampler_ms: float = 0.0
    verify_ms_by_k: dict = field(default_factory=dict)
    draft_ms_steps: list = field(default_factory=list)
    accepted_per_step: list = field(default_factory=list)
    drafted_per_step: list = field(default_factory=list)
    gamma_per_step: list = field(default_factory=list)
    fallback_ms: float = 0.0
    providers: dict = field(default_factory=dict)
    fallbacks: list = field(default_factory=list)
    stop_reason: str = ""

    @property
    def overhead_ms(self) -> float:
        return max(self.total_ms - self.prefill_ms - self.draft_prefill_ms - self.draft_ms - self.verify_ms
                   - self.drafter_load_ms - self.prefill_graph_load_ms + self.overlap_ms, 0.0)

    @property
    def acceptance_rate(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None

    @property
    def tau(self) -> float | None:
        return (self.new_tokens - self.prefill_tokens) / self.verify_forwards if self.verify_forwards else None

    @property
    def tokens_per_s(self) -> float:
        return 1e3 * self.new_tokens / self.total_ms if self.total_ms > 0 else 0.0

    @property
    def decode_tokens_per_s(self) -> float:
        t = self.total_ms - self.ttft_ms
        return 1e3 * (self.new_tokens - self.prefill_tokens) / t if t > 0 else 0.0

    @property
    def overhead_share(self) -> float | None:
        t = self.total_ms - self.prefill_ms
        return self.overhead_ms / t if t > 0 else None

    @property
    def sampler_share(self) -> float | None:
        return self.sampler_ms / self.draft_ms if self.draft_ms > 0 else None

    @property
    def zero_accept_share(self) -> float | None:
        """Share of rounds that drafted something and kept none of it."""
        rounds = [a for d, a in zip(self.drafted_per_step, self.accepted_per_step) if d > 0]
        return sum(a == 0 for a in rounds) / len(rounds) if rounds else None

    @property
    def acceptance_by_position(self) -> list[float]:
        """P(draft j accepted | drafts 1..j-1 accepted and draft j proposed), j = 1.. ."""
        out = []
        for j in range(1, max(self.drafted_per_step, default=0) + 1):
            reached = [a >= j for d, a in zip(self.drafted_per_step, self.accepted_per_step) if d >= j and a >= j - 1]
            out.append(sum(reached) / len(reached) if reached else None)
        return out

    def record_block(self, drafted: int, accepted: int) -> None:
        """Book one verified block: `drafted` drafts were proposed, `accepted` of them kept."""
        self.drafted += drafted
        self.accepted += accepted
        self.drafted_per_step.append(drafted)
        self.accepted_per_step.append(accepted)

    def record_guess(self, accepted: int) -> None:
        """Book a plain step's guess (rounds.plain_step): kept (1) or not (0)."""
        self.guesses += 1
        self.guesses_accepted += accepted

    def record_store(self, drafted: int, accepted: int) -> None:
        """Book a round's drafts from the answer store (rounds.commit)."""
        self.store_drafted += drafted
        self.store_accepted += accepted

    def record_forced(self, drafted: int, accepted: int) -> None:
        """Book a round of the grammar's forced tokens (rounds.forced_round)."""
        self.forced_rounds += 1
        self.forced += drafted
        self.forced_accepted += accepted

    def record_verify(self, k: int, ms: float) -> None:
        self.verify_forwards += 1
        self.target_forwards += 1
        self.verify_ms += ms
        self.verify_ms_by_k.setdefault(k, []).append(ms)

    def to_dict(self) -> dict:
        """All fields plus the derived values (JSON-ready)."""
        d = asdict(self)
        d["verify_ms_by_k"] = {str(k): v for k, v in self.verify_ms_by_k.items()}
        for name in ("overhead_ms", "acceptance_rate", "tau", "tokens_per_s", "decode_tokens_per_s", "overhead_share",
                     "sampler_share", "zero_accept_share", "acceptance_by_position"):
            d[name] = getattr(self, name)
        return d

    def summary(self) -> str:
        acc = "-" if self.acceptance_rate is None else f"{self.acceptance_rate:.3f}"
        tau = "-" if self.tau is None else f"{self.tau:.2f}"
        k = (f"auto (mean {self.draft_length:.2f})" if self.draft_length_setting == "auto" else
             f"{self.draft_length}")
        return (f"{self.strategy} k={k}: {self.new_tokens} tokens, {self.tokens_per_s:.1f} tok/s, "
                f"acceptance {acc}, tau {tau}, ttft {self.ttft_ms:.0f} ms, prefill {self.prefill_ms:.0f} ms, "
                f"draft prefill {self.draft_prefill_ms:.0f} ms, draft {self.draft_ms:.0f} ms, "
                + (f"drafter load {self.drafter_load_ms:.0f} ms, " if self.drafter_load_ms else "")
                + (f"prefill graph load {self.prefill_graph_load_ms:.0f} ms, " if self.prefill_graph_load_ms else "")
                + f"verify {self.verify_ms:.0f} ms, overhead {self.overhead_ms:.0f} ms, "
                f"resyncs {self.drafter_resyncs}")
