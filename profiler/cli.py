"""`edgespec bench`, `edgespec study acceptance` and `edgespec demo`."""
from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from edgespec.help_all import add_help_all
from edgespec.profiler import bench
from edgespec.profiler.demo import register_demo as _register_demo
from edgespec.profiler.report import lossless_line, table
from edgespec.profiler.settings import DEFAULT_MAX_DRAFT_LENGTH, BenchSettings
from edgespec.profiler.study.cli import add_bundle_and_prompts, register_acceptance, register_randomised, register_synthetic
from edgespec.runtime.arguments import add_decoder_arguments, decoder_options, defaults_of, parse_draft_length
from edgespec.runtime.api.config import PREFILL_GRAPH_SETTINGS

BENCH_EPILOG = """\
outputs in OUT/: report.json (docs/report-schema.md), report.md, plots and
records.jsonl (each generation as measured: Ctrl-C keeps it, marked "partial";
--resume continues). Example:
  edgespec bench --bundle B --strategies ar,auto,tli:draft_probability=auto \\
      --report out/bench
"""
BENCH_USAGE = ("%(prog)s --bundle DIR --report OUT [--prompts SET]\n"
               "         [--strategies LIST] [--draft-length LIST] [options]")
BENCH = defaults_of(BenchSettings)    # the flags' defaults are the settings' (profiler/settings.py)
# left out of `bench --help`, listed by --help-all (edgespec/help_all.py)
BENCH_EXPERT = ("--no-warmup", "--bandwidth-mb")

def _csv(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def _draft_lengths(text: str) -> list[int | str]:
    """Comma-separated draft lengths: integers and/or `auto` (the runtime's per-round governor); other
    items are kept for bench's check to refuse in one line."""
    return [parse_draft_length(t) for t in _csv(text)]


def _float_list(text: str) -> list[float]:
    try:
        return [float(t) for t in _csv(text)]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None


def _command() -> str:
    return "edgespec " + " ".join(shlex.quote(a) for a in sys.argv[1:])


# --------------------------------------------------------------------------- bench

def register_bench(subparsers) -> None:
    p = subparsers.add_parser("bench", help="measure speedup, acceptance and MBSU per strategy and draft length",
                              description="Benchmark a bundle: ar against each (strategy, draft length), interleaved\n"
                                          "per prompt, on one execution provider (a prefill graph built up front).",
                              epilog=BENCH_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_bundle_and_prompts(p, "bundle directory")
    p.add_argument("--category", type=_csv, metavar="LIST", help="comma-separated categories to keep (default all)")
    p.add_argument("--limit", type=int, metavar="N", help="at most this many prompts")
    p.add_argument("--strategies", type=_csv, default=BENCH["strategies"], metavar="LIST",
                   help=f"comma-separated (default {','.join(BENCH['strategies'])}; ar always, ar-fast too where "
                        "steps pad); "
                        "NAME:KEY=VALUE[:...] sets a row's options")
    p.add_argument("--draft-length", type=_draft_lengths, default=BENCH["draft_lengths"], metavar="LIST",
                   help=f"comma-separated γ and/or auto (default auto: γ per round up to --option "
                        f"max_draft_length, {DEFAULT_MAX_DRAFT_LENGTH} or the largest γ given)")
    p.add_argument("--max-new-tokens", type=int, default=BENCH["max_new_tokens"], metavar="N")
    p.add_argument("--temperature", type=float, default=BENCH["temperature"], metavar="T", help="0 = greedy (default)")
    p.add_argument("--top-k", type=int, metavar="K")
    p.add_argument("--top-p", type=float, metavar="P")
    p.add_argument("--seed", type=int, default=BENCH["seed"], metavar="N")
    p.add_argument("--chat", action="store_true", help="wrap prompts in the bundle's chat template")
    p.add_argument("--repeats", type=int, default=BENCH["repeats"], metavar="N")
    p.add_argument("--no-warmup", action="store_true", help="skip the warm-up generations")
    p.add_argument("--bandwidth-mb", type=int, default=BENCH["bandwidth_mb"], metavar="MB",
                   help="stream-test size (0: skip)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--report", type=Path, required=True, metavar="OUT", help="report directory")
    p.add_argument("--peers", action="store_true", help="a row: onnxruntime-genai on the same graph (greedy)")
    p.add_argument("--llama-server", type=Path, metavar="BIN",
                   help="a row: llama.cpp's BIN on the same GGUF (greedy)")
    add_decoder_arguments(p, rows=True, deprecated=("--max-draft-length", "--draft-ep", "--draft-threads",
                                                     "--strategy-option"))
    p.add_argument("--resume", action="store_true",
                   help="continue the run journaled in OUT/records.jsonl (same settings; --limit, --repeats may grow)")
    add_help_all(p, BENCH_EXPERT, usage=BENCH_USAGE)
    p.set_defaults(func=run_bench)


def bench_settings(args) -> BenchSettings:
    """--option's draft_ep, draft_threads and max_draft_length are settings of their own (the report
    records them); its other keys are options of every row but ar."""
    options = decoder_options(args)
    own = {key: options.pop(key, None) for key in ("draft_ep", "draft_threads", "max_draft_length")}
    return BenchSettings(
        bundle=args.bundle, report=args.report, prompts=args.prompts, split=args.split, categories=args.category,
        limit=args.limit, strategies=args.strategies, draft_lengths=args.draft_length,
        max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
        seed=args.seed, ep=args.ep, threads=args.threads, **own,
        repeats=args.repeats, warmup=not args.no_warmup, chat=args.chat, options=options,
        bandwidth_mb=args.bandwidth_mb, verify=args.verify, progress=not args.quiet, resume=args.resume,
        peers=args.peers, llama_server=args.llama_server, prefill_graph=PREFILL_GRAPH_SETTINGS[args.prefill_graph],
        command=_command())


def run_bench(args) -> int:
    doc = bench.run_bench(bench_settings(args))
    print(table(doc))
    print("\n" + lossless_line(doc))
    print(f"\nreport: {Path(args.report) / 'report.md'}")
    return 130 if doc["partial"] else 0


# --------------------------------------------------------------------------- study

def register_study(subparsers) -> None:
    p = subparsers.add_parser("study", help="offline studies (acceptance recovery under vocabulary pruning)")
    sub = p.add_subparsers(dest="study", metavar="STUDY", required=True)
    register_acceptance(sub, _csv, _float_list, _command)
    register_synthetic(sub, _csv, _float_list, _command)
    register_randomised(sub, _csv, _float_list, _command)


# --------------------------------------------------------------------------- demo

def register_demo(subparsers) -> None:
    _register_demo(subparsers, _csv, _draft_lengths)


def register(subparsers) -> None:
    register_bench(subparsers)
    register_study(subparsers)
    register_demo(subparsers)
