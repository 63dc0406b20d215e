"""Prefix reuse across calls: a prompt that starts like the previous call's prompt + output (a chat's
next turn, a fixed system prompt, the same document asked again) keeps the KV of that common prefix,
for the target and the drafter, and prefills only the rest.

What the KV holds is recorded only when a generation ends normally (EOS, a stop string, the token
budget). A call starts by forgetting it, so a stream that was closed early, superseded or failed
leaves nothing to reuse: the next call starts cold, never from a half-written KV.

The target keeps at most len(prompt) - 1 positions: the prompt's last token is always run, since its
logits give the first new token. Reused positions were computed by the earlier call's forwards (its
prefill and its verify forwards); a cold prefill computes the same function over the same tokens, and
on graphs whose 1-token kernel path differs every such forward was padded (runtime/engine/kv.py), so the
positions hold what a cold prefill puts there up to float summation order. tests/test_long_prompts.py
checks that the tokens equal a cold call's.

With a prefill graph (SpeculativeDecoder(prefill_graph="auto" or True)) a cold call prefills a long prompt on it,
so a reused call keeps only positions the prefill graph computed (`prefill_graph_rows`: the earlier
prompt, not its answer) and prefills the rest of a long prompt there too, at least 2 tokens (its 1-row
kernel path differs); a short prompt keeps nothing the prefill graph computed. The prefill graph gives
the same bits for a prompt in one forward or in two of 2+ tokens (benchmarks/prefill_chunks.py), so the
reused call's KV is the cold call's, bit for bit. The runner checks that on this machine where it builds
the prefill graph (kv.ModelRunner.check_prefill_chunks); where it fails, a long prompt is never reused.
"""
from __future__ import annotations

from dataclasses import dataclass


def common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


@dataclass
class PrefixCache:
    """What the shared runners' KV caches hold after the last generation that ended normally."""
    target_ids: list[int] | None = None          # target ids of the target KV's positions, in order
    drafter_ids: list[int] | None = None         # the drafter context (ctx.ids) ...
    drafter_anchor: int = 0                       # ... and the window over it (context.DrafterWindow)
    drafter_sink: tuple = ()

    def forget(self) -> None:
        self.target_ids = self.drafter_ids = None

    def remember(self, target_ids: list[int], ctx_ids: list[int] | None = None, window=None) -> None:
        self.target_ids = list(target_ids)
        if ctx_ids is not None and window is not None:
            self.drafter_ids = list(ctx_ids)
            self.drafter_anchor, self.drafter_sink = window.anchor, tuple(window.sink)

    def target_reuse(self, prompt_ids: list[int], runner) -> int:
        """Crop the target KV to the longest reusable prefix of prompt_ids (reset when none); returns
        the number of positions kept. The runner must hold `target_ids` (forget() otherwise)."""
        n = 0
        if self.target_ids is not None and len(self.target_ids) == runner.length:
            n = min(common_prefix(self.target_ids, prompt_ids), len(prompt_ids) - 1)
            if runner.prefill_graph_for(len(prompt_ids)):
                n = min(n, runner.prefill_graph_rows, len(prompt_ids) - 2) if runner.prefill_chunks_exact else 0
            elif runner.prefill_graph_rows:
                n = 0
        if n > 0:
            runner.crop(n)
        else:
            runner.reset()
        return n

    def drafter_reuse(self, ctx_ids: list[int], runner, window) -> int:
        """Keep the drafter KV (and its window) for the part of ctx_ids it still matches; returns the
        drafter positions kept (0: reset)."""
        old = self.drafter_ids
        if old is not None and runner.length:
            window.anchor, window.sink = self.drafter_anchor, list(self.drafter_sink)
            same = common_prefix(old[:window.covered(runner.length)], ctx_ids)
            if window.anchor < same < len(ctx_ids):
                window.keep_valid(same, runner)
                return runner.length
        runner.reset()
        window.anchor, window.sink = 0, []
        return 0
