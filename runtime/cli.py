"""`edgespec generate`: the runtime API on the command line (see SpeculativeDecoder)."""
from __future__ import annotations

import argparse
import json
import sys

from edgespec.errors import GenerationError
from edgespec.runtime.arguments import add_decoder_arguments, decoder_from_args, defaults_of
from edgespec.runtime.api.checks import check_generation_args
from edgespec.runtime.api.decoder import SpeculativeDecoder

GENERATE = defaults_of(SpeculativeDecoder.generate)     # the flags' defaults are generate()'s


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "generate", help="generate text from a bundle with speculative decoding",
        description="Generate with a bundle's target, speeded up by its drafter. Lossless: greedy output equals "
                    "--strategy ar's; sampled output follows the target's distribution.")
    add_decoder_arguments(p, deprecated=("--draft-ep", "--drafter-window", "--plain-steps", "--max-draft-length",
                                         "--draft-confidence"))
    p.add_argument("--prompt", required=True, help="prompt text ('-' reads it from stdin)")
    p.add_argument("--max-new-tokens", type=int, default=GENERATE["max_new_tokens"], metavar="N")
    p.add_argument("--temperature", type=float, default=GENERATE["temperature"], metavar="T", help="0 = greedy (default)")
    p.add_argument("--top-k", type=int, default=None, metavar="K")
    p.add_argument("--top-p", type=float, default=None, metavar="P")
    p.add_argument("--min-p", type=float, default=None, metavar="P",
                   help="drop tokens below P times the top token's probability (after top-p)")
    p.add_argument("--seed", type=int, default=None, metavar="N")
    p.add_argument("--stop", action="append", default=None, metavar="TEXT", help="stop string (repeatable)")
    p.add_argument("--chat", action="store_true", help="apply the bundle's chat template")
    p.add_argument("--stream", action="store_true", help="print text as it is generated")
    p.add_argument("--stats", action="store_true", help="print generation statistics to stderr")
    p.add_argument("--json", action="store_true", help="print the result (text, token ids, stats) as JSON")
    p.set_defaults(func=_generate)


def read_stdin_prompt() -> str:
    """The prompt from stdin, read as UTF-8 whatever the locale; bytes that are not UTF-8 are refused
    in one line (docs/runtime.md)."""
    data = sys.stdin.buffer.read()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise GenerationError(f"the prompt on stdin is not UTF-8 (byte 0x{data[exc.start]:02x} at offset "
                              f"{exc.start}); edgespec reads text as UTF-8") from None


def _generate(args: argparse.Namespace) -> int:
    check_generation_args(args.max_new_tokens, args.temperature, args.top_k, args.top_p, args.seed, args.stop,
                          args.min_p)
    prompt = read_stdin_prompt() if args.prompt == "-" else args.prompt
    if not prompt:
        raise GenerationError("empty prompt")
    dec = decoder_from_args(args)
    kw = dict(max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
              min_p=args.min_p, seed=args.seed, stop=args.stop, chat=args.chat)
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
