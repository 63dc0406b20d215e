"""One decoder, many clients: a FIFO queue served one request at a time by one worker thread.

The worker owns the only `SpeculativeDecoder` (no second model copy). A `Job` carries token ids and
generation settings in, and events out to the asyncio side (`loop.call_soon_threadsafe`):
("start", None), ("delta", str), ("done", Outcome) or ("error", APIError). A job answering with tool
calls carries a `guard` (serve/calls.CallGuard): the text goes through it, and it may end the
generation (a repeated call); under tool_choice "auto", a call the conversation already made is
answered in text instead (`text_fallback`: the settings' overrides for that, a text-only grammar); the
call's generation is first run to its end (one token: `_drain`), so that the text answer reuses the
prompt's KV instead of prefilling it again. A job can be cancelled at
any time (client gone, server shutting down, deadline passed): a queued job is dropped, a running one
stops before its next round, and the decoder's next generation starts from scratch.
"""
from __future__ import annotations

import asyncio
import collections
import math
import threading
import time
from dataclasses import dataclass

from edgespec.errors import EdgespecError
from edgespec.serve.protocol import APIError

# GenerationStats fields also in the response's "edgespec" object: where a request's time went (prefill
# after prefix reuse, verify forwards) and which drafts were kept (runtime/api/stats.py)
DRAIN_ROUNDS = 4         # rounds a generation ended at a repeated call may run on to complete (Worker._drain)
EXT_COUNTS = ("prefill_ms", "reused_tokens", "verify_forwards", "drafted", "accepted", "store_drafted",
              "store_accepted", "guesses", "guesses_accepted", "forced", "forced_accepted")


@dataclass
class Outcome:
    text: str
    prompt_tokens: int
    completion_tokens: int
    stop_reason: str              # eos | stop | length | disconnect | timeout | shutdown | interrupted
    ext: dict                     # the response's "edgespec" object
    logprobs: list | None = None  # the target's TokenLogprob per token (GenerationResult.logprobs)


class Job:
    def __init__(self, prompt_ids: list[int], settings: dict, deadline: float, loop: asyncio.AbstractEventLoop,
                 deltas: bool = True, guard=None, text_fallback: dict | None = None):
        self.prompt_ids, self.settings, self.deadline = prompt_ids, settings, deadline
        self.guard = guard            # serve/calls.CallGuard, or None
        self.text_fallback = text_fallback   # settings overrides of a text answer (guard: a call already made)
        self.deltas = deltas          # False: only start/done/error are posted (a non-streamed request)
        self.loop = loop
        self.events: asyncio.Queue = asyncio.Queue()
        self.cancelled = threading.Event()
        self.cancel_reason = "interrupted"
        self.enqueued = time.perf_counter()
        self.position = 0             # jobs ahead of this one when it arrived (the running one included)

    def cancel(self, reason: str) -> None:
        if not self.cancelled.is_set():
            self.cancel_reason = reason
            self.cancelled.set()

    def post(self, kind: str, payload=None) -> None:
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, (kind, payload))
        except RuntimeError:          # the event loop is closed: nobody is listening any more
            pass


class Worker:
    def __init__(self, decoder, max_queue: int = 16):
        self.dec = decoder
        self.max_queue = max_queue
        self._queue: collections.deque[Job] = collections.deque()
        self._cond = threading.Condition()
        self.current: Job | None = None
        self.closing = False
        self.served = 0
        self.last: dict | None = None        # the last finished job (for /health)
        self._service_s: collections.deque[float] = collections.deque(maxlen=16)
        self._thread = threading.Thread(target=self._loop, name="edgespec-decoder", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ the asyncio side
    def submit(self, job: Job) -> None:
        with self._cond:
            if self.closing:
                raise APIError(503, "the server is shutting down", code="shutting_down")
            if len(self._queue) >= self.max_queue:
                raise APIError(429, f"the request queue is full ({self.max_queue} waiting); retry later",
                               code="queue_full", type_="rate_limit_exceeded",
                               headers={"Retry-After": str(self.retry_after())})
            job.position = len(self._queue) + (self.current is not None)
            self._queue.append(job)
            self._cond.notify()

    def drop(self, job: Job, reason: str) -> None:
        """Cancel a job; a queued one also leaves the queue at once (its slot frees up)."""
        job.cancel(reason)
        with self._cond:
            try:
                self._queue.remove(job)
            except ValueError:
                pass

    def retry_after(self) -> int:
        mean = sum(self._service_s) / len(self._service_s) if self._service_s else 1.0
        return max(1, math.ceil(mean * (len(self._queue) + 1)))

    @property
    def queued(self) -> int:
        return len(self._queue)

    @property
    def busy(self) -> bool:
        return self.current is not None

    def shutdown(self) -> None:
        """Stop taking requests, end the running generation (its stream gets a final chunk) and refuse
        the queued ones. Safe to call from a signal handler."""
        with self._cond:
            self.closing = True
            cur = self.current
            self._cond.notify_all()
        if cur is not None:
            cur.cancel("shutdown")

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    # ------------------------------------------------------------------ the decoder thread
    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self.closing:
                    self._cond.wait()
                if not self._queue:
                    return
                job = self._queue.popleft()
                if self.closing:
                    job.post("error", APIError(503, "the server is shutting down", code="shutting_down"))
                    continue
                self.current = job
            t0 = time.perf_counter()
            try:
                final = self._serve(job)
            except Exception as exc:       # never let one request kill the worker
                final = ("error", APIError(500, f"internal error: {type(exc).__name__}: {exc}"))
            self._service_s.append(time.perf_counter() - t0)
            with self._cond:               # bookkeeping first: /health is current once the client has its answer
                self.current = None
                self.served += 1
            if final is not None:
                job.post(*final)

    def _serve(self, job: Job) -> tuple | None:
        """Run one job; returns its final event ("done" or "error"), None for a job cancelled while queued."""
        if job.cancelled.is_set():
            return None
        queue_ms = (time.perf_counter() - job.enqueued) * 1e3
        if time.monotonic() >= job.deadline:
            return "error", APIError(504, f"the request timed out after {queue_ms / 1e3:.1f} s in the queue",
                                     code="timeout")
        try:
            stream = self.dec.stream(job.prompt_ids, **job.settings)
        except EdgespecError as exc:
            return "error", APIError(400, str(exc))
        job.post("start", {"queue_ms": queue_ms})
        reason, guard, fallback = None, job.guard, False
        try:
            reason = self._drive(job, stream, guard)
            if guard is not None and guard.repeated and job.text_fallback is not None:
                fallback = True
                # tool_choice "auto" and a call already made in the conversation: a text answer instead
                stream.close()
                stream = self.dec.stream(job.prompt_ids, **dict(job.settings, **job.text_fallback))
                reason = self._drive(job, stream, guard.passthrough())
        except EdgespecError as exc:      # mid-generation: the client's deltas so far stand
            return "error", APIError(500, f"the generation failed: {exc}", code="generation_error")
        finally:
            stream.close()
        res = self.dec.last_result
        text = res.text
        if guard is not None:             # an unfinished call (cut by max_tokens) is never sent
            rest = guard.finish()
            if job.deltas and rest:
                job.post("delta", rest)
            text = guard.text
        st = res.stats
        reason = reason or st.stop_reason
        ext = {"strategy": st.strategy, "draft_length": st.draft_length,
               "draft_length_setting": st.draft_length_setting, "acceptance": st.acceptance_rate, "tau": st.tau,
               "decode_tokens_per_s": st.decode_tokens_per_s, "ttft_ms": st.ttft_ms, "total_ms": st.total_ms,
               "queue_ms": queue_ms, "queue_position": job.position, "stop_reason": reason, "text_fallback": fallback,
               **{k: getattr(st, k) for k in EXT_COUNTS}}
        self.last = {"stop_reason": reason, "completion_tokens": len(res.token_ids), "total_ms": st.total_ms}
        return "done", Outcome(text=text, prompt_tokens=len(res.prompt_token_ids),
                               completion_tokens=len(res.token_ids), stop_reason=reason, ext=ext,
                               logprobs=getattr(res, "logprobs", None))

    @staticmethod
    def _drain(job: Job, stream) -> None:
        """Run a generation to its end without posting it (at most DRAIN_ROUNDS more rounds), so that it
        completes: the decoder then keeps the KV of the prompt for the next generation (runtime/engine/prefix.py),
        which a stream closed early forgets. The text fallback re-reads the same prompt."""
        for i, _ in enumerate(stream):
            if i >= DRAIN_ROUNDS or job.cancelled.is_set() or time.monotonic() >= job.deadline:
                return

    def _drive(self, job: Job, stream, guard) -> str | None:
        """Iterate one generation, posting its deltas (through the guard) and, asked for, the log-probabilities
        of the tokens committed since the last delta (before it); the reason it was cut short, None if it
        ended by itself."""
        posted = 0
        logprobs = job.deltas and job.settings.get("logprobs") is not None
        for delta in stream:
            if guard is not None:
                delta = guard.feed(delta)
            if logprobs and delta:
                entries = self.dec.last_generation.logprobs
                job.post("logprobs", list(entries[posted:]))
                posted = len(entries)
            if job.deltas and delta:
                job.post("delta", delta)
            if guard is not None and guard.done:     # a repeated tool call: the answer ends before it
                if not guard.parallel:               # one call allowed: what is left is its end (EOS), and a
                    Worker._drain(job, stream)       # completed generation leaves its KV to the next one
                return "stop"
            if job.cancelled.is_set():
                return job.cancel_reason
            if time.monotonic() >= job.deadline:
                return "timeout"
        return None
