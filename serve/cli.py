"""`edgespec serve` (an OpenAI-compatible local server; the [serve] extra) and `edgespec chat`
(an interactive chat in the terminal; runtime only)."""
from __future__ import annotations

from edgespec.runtime.arguments import add_decoder_arguments, defaults_of
from edgespec.serve.chat import run_chat
from edgespec.serve.server import serve
from edgespec.serve.settings import Settings
from edgespec.serve.worker import Worker

SERVE = {**defaults_of(Settings), "max_queue": defaults_of(Worker)["max_queue"]}   # the flags' defaults


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "serve", help="serve a bundle over an OpenAI-compatible HTTP API (needs the [serve] extra)",
        description="An OpenAI-compatible local server: GET /v1/models, POST /v1/chat/completions and "
                    "/v1/completions (plain and streamed), GET /health. One decoder serves the requests one at "
                    "a time, first come first served.")
    add_decoder_arguments(p)
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000; 0 picks a free one)")
    p.add_argument("--api-key", default=SERVE["api_key"], metavar="KEY",
                   help="require 'Authorization: Bearer KEY' on every route but /health (default: $EDGESPEC_API_KEY)")
    p.add_argument("--model-name", default=None, metavar="NAME", help="model name to serve as (default: the bundle "
                                                                      "directory's name)")
    p.add_argument("--max-queue", type=int, default=SERVE["max_queue"], metavar="N",
                   help=f"requests that may wait behind the running one (default {SERVE['max_queue']}); more get "
                        "429 + Retry-After")
    p.add_argument("--max-tokens-cap", type=int, default=SERVE["max_tokens_cap"], metavar="N",
                   help=f"the most tokens one request generates (default {SERVE['max_tokens_cap']})")
    p.add_argument("--timeout", type=float, default=SERVE["timeout"], metavar="S",
                   help=f"seconds a request may take, queue wait included (default {SERVE['timeout']:g})")
    p.add_argument("--max-body", type=int, default=SERVE["max_body"], metavar="BYTES",
                   help=f"largest request body (default {SERVE['max_body']} bytes)")
    p.add_argument("--no-cross-request", action="store_true",
                   help="no answer store: earlier requests' answers never draft for later ones (docs/runtime.md)")
    p.set_defaults(func=_serve)

    c = subparsers.add_parser(
        "chat", help="chat with a bundle in the terminal (streaming; /reset, /stats, Ctrl-C stops a reply)",
        description="An interactive chat using the bundle's chat template. Commands: /reset, /stats, /help, /exit.")
    add_decoder_arguments(c)
    c.add_argument("--system", default=None, metavar="TEXT", help="a system message to start each conversation")
    c.add_argument("--max-new-tokens", type=int, default=512, metavar="N", help="per reply (default 512)")
    c.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    c.add_argument("--top-p", type=float, default=None)
    c.add_argument("--seed", type=int, default=None)
    c.add_argument("--stats", action="store_true", help="print acceptance and tok/s after each reply (to stderr)")
    c.set_defaults(func=_chat)


def _serve(args) -> int:
    return serve(args)


def _chat(args) -> int:
    return run_chat(args)
