"""What keeps a slow client from taking the server over: a time limit on a request's headers, a bound
on open connections, and a log that says so in at most one line a second.

uvicorn bounds only idle keep-alive connections: a client that sends its headers a byte at a time
holds a socket (and a file descriptor) as long as it likes, and once descriptors run out every accept
fails and is logged with a traceback. `protocol_class` is uvicorn's h11 protocol with
- a header timeout: from the connection's start (or the previous response's end) to the end of the
  request's headers; past it the connection is closed;
- a connection bound (`default_max_connections`: below the process's descriptor limit), so accept
  itself never runs out of descriptors: past it, the connection that has waited longest for its
  headers is closed to make room (a slow-header flood cannot keep a quick client out), or, where every
  open connection is busy with a request, the new one;
and `Notices` turns these and the event loop's own errors into one counted line a second at most.
The body's own time limit is the app's (serve/app.py, read_json).
"""
from __future__ import annotations

import os
import resource
import sys
import time

ACCEPT_BURST = 64          # the listen backlog, which is also how many connections asyncio accepts at once
SPARE_FDS = ACCEPT_BURST + 32    # beyond those open at start: one burst accepted before any is refused, and more
MAX_CONNECTIONS = 512        # the bound where the descriptor limit allows more


def open_descriptors() -> int:
    """Descriptors this process has open now (the bundle's files, ORT's, pipes), or a guess off Linux."""
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return 64


def default_max_connections() -> int:
    """Open connections allowed: MAX_CONNECTIONS, or fewer where the descriptor limit, less what is open
    already (call it once the decoder is loaded), is lower."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return MAX_CONNECTIONS
    return max(8, min(MAX_CONNECTIONS, soft - open_descriptors() - SPARE_FDS))


class Notices:
    """Counted server notices, printed as one line at most once a second (to stderr)."""

    def __init__(self, interval_s: float = 1.0, stream=None):
        self.interval_s, self.stream = interval_s, stream or sys.stderr
        self.counts: dict[str, int] = {}
        self.last = 0.0
        self.pending = False
        self.lines = 0                    # lines written (the tests read it)

    def note(self, what: str, loop=None) -> None:
        self.counts[what] = self.counts.get(what, 0) + 1
        now = time.monotonic()
        if now - self.last >= self.interval_s:
            self.flush()
        elif not self.pending and loop is not None:
            self.pending = True
            loop.call_later(self.interval_s - (now - self.last), self.flush)

    def flush(self) -> None:
        self.pending = False
        if not self.counts:
            return
        parts = ", ".join(f"{n} {what}" for what, n in sorted(self.counts.items()))
        self.counts.clear()
        self.last = time.monotonic()
        self.lines += 1
        print(f"edgespec serve: {parts}", file=self.stream, flush=True)

    def loop_exception_handler(self, loop, context: dict) -> None:
        """The event loop's errors (a failed accept, a transport error) as counted one-line notices."""
        exc = context.get("exception")
        what = context.get("message", "event loop error")
        if exc is not None:
            what = f"{what} ({type(exc).__name__}: {' '.join(str(exc).split())[:80]})"
        self.note(what, loop)


def protocol_class(header_timeout: float, max_connections: int, notices: Notices):
    """uvicorn's H11Protocol with the header timeout and the connection bound (module docstring)."""
    from uvicorn.protocols.http.h11_impl import H11Protocol  # lazy: the [serve] extra

    waiting: dict = {}            # connections waiting for a request's headers, oldest first

    class GuardedH11Protocol(H11Protocol):
        _header_timer = None
        _waiting_cycle = None

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            if len(self.connections) > max_connections:
                oldest = next(iter(waiting), None)
                if oldest is None:
                    notices.note(f"connections refused (over {max_connections} open, all busy)", self.loop)
                    transport.abort()
                    return
                notices.note(f"connections closed to make room (over {max_connections} open, headers pending)",
                             self.loop)
                oldest._disarm()
                oldest.transport.abort()
            self._arm()

        def _arm(self) -> None:
            self._disarm()
            self._waiting_cycle = self.cycle      # the headers are in once a new cycle exists
            self._header_timer = self.loop.call_later(header_timeout, self._headers_too_slow)
            waiting[self] = None

        def _disarm(self) -> None:
            waiting.pop(self, None)
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _headers_too_slow(self) -> None:
            self._header_timer = None
            waiting.pop(self, None)
            if self._between_requests() and self.cycle is self._waiting_cycle and not self.transport.is_closing():
                notices.note(f"connections closed (headers not complete within {header_timeout:g} s)", self.loop)
                self.transport.abort()

        def _between_requests(self) -> bool:
            return self.cycle is None or self.cycle.response_complete

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self._header_timer is not None and self.cycle is not self._waiting_cycle:
                self._disarm()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing() and self._between_requests():
                self._arm()                       # the next request on this connection gets the same limit

        def connection_lost(self, exc) -> None:
            self._disarm()
            super().connection_lost(exc)

    return GuardedH11Protocol
