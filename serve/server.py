"""`edgespec serve`: load the bundle once, start the decoder worker, serve the app with uvicorn.

Shutdown (SIGTERM or Ctrl-C): the worker stops the running generation (its stream ends with a final
chunk and `data: [DONE]`), queued requests get a 503, uvicorn waits for the open responses, and the
process exits 0.
"""
from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys

from edgespec.errors import EdgespecError
from edgespec.runtime.arguments import decoder_from_args, decoder_options
from edgespec.runtime.bundle.bundle import Bundle
from edgespec.runtime.api.decoder import SpeculativeDecoder
from edgespec.runtime.round.strategies import get_strategy
from edgespec.serve.worker import Worker


class ServeError(EdgespecError):
    """Bad server settings (port, queue size, key...)."""


class NoticeFilter(logging.Filter):
    """uvicorn's own log lines (a malformed request, a failed bind) as counted one-line notices
    (connections.Notices: one line a second at most, no tracebacks)."""

    def __init__(self, notices):
        super().__init__()
        self.notices = notices

    def filter(self, record: logging.LogRecord) -> bool:
        self.notices.note(" ".join(record.getMessage().split())[:200])
        return False


def make_decoder(bundle, args, defer_drafter: bool = True) -> SpeculativeDecoder:
    """The decoder `serve` and `chat` share (runtime/arguments.py; auto draft length means 1 for a strategy
    that does not speculate, e.g. ar). The server builds the drafter's session at start
    (defer_drafter=False) so that no request waits for it; the chat defers it past the first reply's
    first token; `--option defer_drafter=...` overrides either."""
    gamma = args.draft_length
    if gamma == "auto" and not get_strategy(args.strategy).speculative:
        gamma = 1
    store = {"answer_store_mb": 0} if getattr(args, "no_cross_request", False) else {}    # serve --no-cross-request
    return decoder_from_args(args, bundle, draft_length=gamma,
                             options={"defer_drafter": defer_drafter, **decoder_options(args), **store})


def check_args(args) -> None:
    if not 0 <= args.port <= 65535:
        raise ServeError(f"--port must be in [0, 65535], got {args.port}")
    for name in ("max_queue", "max_tokens_cap", "max_body", "max_n"):
        if getattr(args, name) < 1:
            raise ServeError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    for name in ("timeout", "header_timeout", "body_timeout"):
        if not getattr(args, name) > 0:
            raise ServeError(f"--{name.replace('_', '-')} must be > 0 seconds, got {getattr(args, name)}")
    if args.max_connections is not None and args.max_connections < 1:
        raise ServeError(f"--max-connections must be >= 1, got {args.max_connections}")
    if args.api_key is not None and not args.api_key.strip():
        raise ServeError("--api-key (or EDGESPEC_API_KEY) must not be empty")


def serve(args) -> int:
    try:  # lazy: the [serve] extra
        import uvicorn  # lazy: the [serve] extra
        from edgespec.serve.app import Settings, build_app  # lazy: the [serve] extra
        from edgespec.serve.connections import (ACCEPT_BURST, Notices, default_max_connections,  # lazy: uvicorn
                                                 protocol_class)
    except ModuleNotFoundError as exc:
        raise ServeError(f"edgespec serve needs the [serve] extra ({exc.name} is missing): "
                         "pip install 'edgespec[serve]'") from None
    args.api_key = args.api_key if args.api_key is not None else os.environ.get("EDGESPEC_API_KEY") or None
    check_args(args)
    bundle = Bundle.load(args.bundle, verify=args.verify)
    dec = make_decoder(bundle, args, defer_drafter=False)
    name = args.model_name or bundle.path.name
    worker = Worker(dec, max_queue=args.max_queue)
    settings = Settings(model=name, api_key=args.api_key, max_body=args.max_body, max_tokens_cap=args.max_tokens_cap,
                        timeout=args.timeout, strict_model=args.strict_model, host=args.host,
                        allowed_hosts=tuple(args.allowed_hosts), cors_origins=tuple(args.cors_origins),
                        header_timeout=args.header_timeout, body_timeout=args.body_timeout,
                        max_connections=args.max_connections or default_max_connections(), max_n=args.max_n)
    notices = Notices()
    app = build_app(worker, settings, notices)
    http = protocol_class(settings.header_timeout, settings.max_connections, notices)
    config = uvicorn.Config(app, host=args.host, port=args.port, log_level="warning", access_log=False,
                            timeout_graceful_shutdown=30, lifespan="off", http=http, backlog=ACCEPT_BURST)
    logging.getLogger("uvicorn.error").addFilter(NoticeFilter(notices))
    eps = ",".join(p.replace("ExecutionProvider", "") for p in dec.providers["target"][:1])
    strategy = f"{dec.strategy.name} (draft length {dec.config.draft_length})"

    class Server(uvicorn.Server):
        async def startup(self, sockets=None):
            asyncio.get_running_loop().set_exception_handler(notices.loop_exception_handler)
            await super().startup(sockets)
            if self.should_exit or not getattr(self, "servers", None):
                return
            host, port = self.servers[0].sockets[0].getsockname()[:2]
            print(f"edgespec serve: bundle {bundle.path} as '{name}', EP {eps}, strategy {strategy}, "
                  f"http://{host}:{port}" + (" (API key required)" if args.api_key else ""),
                  file=sys.stderr, flush=True)

        def handle_exit(self, sig, frame):
            worker.shutdown()           # end the running stream now, refuse the queue
            super().handle_exit(sig, frame)

    # uvicorn re-raises the signal it caught once it has shut down; a no-op handler makes that exit 0
    previous = signal.signal(signal.SIGTERM, lambda *_: None)
    try:
        Server(config).run()
    finally:
        signal.signal(signal.SIGTERM, previous)
        worker.shutdown()
        worker.join(timeout=5)
        dec.close()
    return 0
