"""`edgespec generate`: the runtime API on the command line (see SpeculativeDecoder)."""
from __future__ import annotations

import argparse
import json
import sys

from edgespec.errors import GenerationError
from edgespec.runtime.bundle import Bundle
from edgespec.runtime.checks import DEFAULT_DRAFTER_WINDOW, PLAIN_STEPS, check_draft_length, check_generation_args
from edgespec.runtime.config import PREFILL_GRAPH_HELP, PREFILL_GRAPH_SETTINGS
from edgespec.runtime.decoder import SpeculativeDecoder


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "generate", help="generate text from a bundle with speculative decoding",
        description="Generate with a bundle's target, speeded up by its drafter. Lossless: greedy output "
                    "equals --strategy ar token for token; sampled output follows the target's distribution.")
    p.add_argument("--bundle", required=True, metavar="DIR", help="bundle directory (from `edgespec export`)")
    p.add_argument("--prompt", required=True, help="prompt text ('-' reads it from stdin)")
    p.add_argument("--strategy", default="auto", help="auto (default: slem for greedy on a heterogeneous pair, "
                                                      "else tli), ar, sd, tli, slem, rdk-taylor, rdk, ngram, ngram-tli")
    p.add_argument("--draft-length", type=_draft_length, default="auto", metavar="K|auto",
                   help="draft tokens per target verify (default auto: chosen per round, 0 when speculation "
                        "does not pay)")
    p.add_argument("--drafter-window", type=_window, default=DEFAULT_DRAFTER_WINDOW, metavar="N|all",
                   help=f"drafter context positions (default {DEFAULT_DRAFTER_WINDOW}; all: the whole text)")
    p.add_argument("--plain-steps", choices=PLAIN_STEPS, default="exact",
                   help="1-token target steps: exact (padded where the graph asks; greedy output = speculative "
                        "output, default) or fast (the graph's 1-token path)")
    p.add_argument("--max-draft-length", type=int, default=8, metavar="K", help="the most --draft-length auto drafts")
    p.add_argument("--prefill-graph", choices=list(PREFILL_GRAPH_SETTINGS), default="auto",
                   help=PREFILL_GRAPH_HELP)
    p.add_argument("--draft-confidence", type=float, default=None, metavar="P",
                   help="stop drafting when the drafter's top probability falls below P")
    p.add_argument("--max-new-tokens", type=int, default=128, metavar="N")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--top-p", type=float, default=None)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--stop", action="append", default=None, metavar="TEXT", help="stop string (repeatable)")
    p.add_argument("--ep", default="cpu", help="execution provider: cpu, cuda, tensorrt, dml, qnn, openvino, coreml, "
                                              "rocm, or a comma-separated list of ORT provider names (default cpu)")
    p.add_argument("--draft-ep", default=None, help="execution provider for the drafter (default: --ep)")
    p.add_argument("--threads", type=int, default=None, help="intra-op threads per session (default: measured policy)")
    p.add_argument("--allow-fallback", action="store_true", help="run on CPU if the requested EP is not active")
    p.add_argument("--draft-probability", default=None, help="randomised drafting: a in (0, 1] or 'auto'")
    p.add_argument("--chat", action="store_true", help="apply the bundle's chat template")
    p.add_argument("--stream", action="store_true", help="print text as it is generated")
    p.add_argument("--stats", action="store_true", help="print generation statistics to stderr")
    p.add_argument("--json", action="store_true", help="print the result (text, token ids, stats) as JSON")
    p.add_argument("--verify", default="fast", choices=["full", "fast", "none"], help="bundle file checks (default fast)")
    p.set_defaults(func=_generate)


def _draft_length(value: str):
    return value if value == "auto" else int(value)


def _window(value: str):
    if value == "all":
        return None
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--drafter-window takes a whole number or 'all', got {value!r}") from None


def _ep(value: str | None):
    if value is None or "," not in value:
        return value
    return [v.strip() for v in value.split(",") if v.strip()]


def _generate(args: argparse.Namespace) -> int:
    check_generation_args(args.max_new_tokens, args.temperature, args.top_k, args.top_p, args.seed, args.stop)
    prompt = sys.stdin.read() if args.prompt == "-" else args.prompt
    if not prompt:
        raise GenerationError("empty prompt")
    a = args.draft_probability
    if a not in (None, "auto"):
        try:
            a = float(a)
        except ValueError:
            raise GenerationError(f"--draft-probability must be a number in (0, 1] or 'auto', got {a!r}") from None
        if not 0.0 < a <= 1.0:
            raise GenerationError(f"--draft-probability must be in (0, 1] or 'auto', got {a!r}")
    check_draft_length(args.draft_length)
    check_draft_length(args.max_draft_length)
    dec = SpeculativeDecoder(Bundle.load(args.bundle, verify=args.verify), strategy=args.strategy,
                             draft_length=args.draft_length, ep=_ep(args.ep), draft_ep=_ep(args.draft_ep),
                             threads=args.threads, allow_fallback=args.allow_fallback, draft_probability=a,
                             max_draft_length=args.max_draft_length, draft_confidence=args.draft_confidence,
                             drafter_window=args.drafter_window, plain_steps=args.plain_steps,
                             prefill_graph=PREFILL_GRAPH_SETTINGS[args.prefill_graph])
    kw = dict(max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
              seed=args.seed, stop=args.stop, chat=args.chat)
    if args.stream and not args.json:
        for delta in dec.stream(prompt, **kw):
            sys.stdout.write(delta)
            sys.stdout.flush()
        sys.stdout.write("\n")
        res = dec.last_result
    else:
        res = dec.generate(prompt, **kw)
        if args.json:
            print(json.dumps({"text": res.text, "token_ids": res.token_ids, "stats": res.stats.to_dict()},
                             ensure_ascii=False))
        else:
            print(res.text)
    if args.stats:
        print(res.stats.summary(), file=sys.stderr)
    return 0
