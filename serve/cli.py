"""`edgespec serve` (an OpenAI-compatible local server; the [serve] extra) and `edgespec chat`
(an interactive chat in the terminal; runtime only)."""
from __future__ import annotations

from edgespec.help_all import add_help_all
from edgespec.runtime.arguments import add_decoder_arguments, defaults_of
from edgespec.serve.chat import run_chat
from edgespec.serve.server import serve
from edgespec.serve.settings import Settings
from edgespec.serve.worker import Worker

SERVE = {**defaults_of(Settings), "max_queue": defaults_of(Worker)["max_queue"]}   # the flags' defaults
# left out of serve's --help, listed by --help-all (edgespec/help_all.py)
SERVE_EXPERT = ("--header-timeout", "--body-timeout", "--max-connections", "--max-n", "--max-body", "--strict-model",
                "--no-cross-request")
SERVE_USAGE = ("%(prog)s --bundle DIR [--host HOST] [--port PORT] [--api-key KEY]\n"
               "         [--allowed-hosts NAMES] [--cors-origins ORIGINS] [options]")


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "serve", help="serve a bundle over an OpenAI-compatible HTTP API (needs the [serve] extra)",
        description="An OpenAI-compatible local server: /v1/models, /v1/chat/completions, /v1/completions, "
                    "/v1/responses (each also without /v1), /health (docs/serve.md).")
    add_decoder_arguments(p)
    p.add_argument("--host", default=SERVE["host"], help=f"address to bind (default {SERVE['host']}: this machine only)")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000; 0 picks a free one)")
    p.add_argument("--api-key", default=SERVE["api_key"], metavar="KEY",
                   help="require 'Authorization: Bearer KEY' (or 'X-Api-Key: KEY') on every route but /health "
                        "(default: $EDGESPEC_API_KEY)")
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
    p.add_argument("--strict-model", action="store_true",
                   help="refuse a request naming another model (404) or none (400); by default any name serves "
                        "the bundle, as llama-server and Ollama do")
    p.add_argument("--allowed-hosts", type=_names, default=SERVE["allowed_hosts"], metavar="NAMES",
                   help="Host names to answer besides local ones, comma-separated ('*' any)")
    p.add_argument("--cors-origins", type=_names, default=SERVE["cors_origins"], metavar="ORIGINS",
                   help="web origins allowed to call the server (CORS), comma-separated ('*' any)")
    p.add_argument("--header-timeout", type=float, default=SERVE["header_timeout"], metavar="S",
                   help=f"seconds a connection may take to send a request's headers (default "
                        f"{SERVE['header_timeout']:g})")
    p.add_argument("--body-timeout", type=float, default=SERVE["body_timeout"], metavar="S",
                   help=f"seconds a request may take to send its body (default {SERVE['body_timeout']:g})")
    p.add_argument("--max-connections", type=int, default=SERVE["max_connections"], metavar="N",
                   help="open connections allowed (default: below the process's file-descriptor limit); more are "
                        "closed at once")
    p.add_argument("--max-n", type=int, default=SERVE["max_n"], metavar="N",
                   help=f"choices one request may ask for with n (default {SERVE['max_n']})")
    p.add_argument("--no-cross-request", action="store_true",
                   help="no answer store: earlier requests' answers never draft for later ones (docs/runtime.md)")
    p.set_defaults(func=_serve)
    add_help_all(p, SERVE_EXPERT, usage=SERVE_USAGE)

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


def _names(text: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in text.split(",") if x.strip())


def _serve(args) -> int:
    return serve(args)


def _chat(args) -> int:
    return run_chat(args)
