"""`edgespec bench`, `edgespec study acceptance` and `edgespec demo`."""
from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from edgespec.profiler import bench
from edgespec.profiler.bench import parse_options
from edgespec.profiler.demo import register_demo as _register_demo
from edgespec.profiler.report import lossless_line, table
from edgespec.profiler.settings import AUTO, DEFAULT_MAX_DRAFT_LENGTH, BenchSettings
from edgespec.profiler.study.cli import add_bundle_and_prompts, register_acceptance, register_randomised, register_synthetic
from edgespec.runtime.config import PREFILL_GRAPH_HELP, PREFILL_GRAPH_SETTINGS

BENCH_EPILOG = """\
outputs in REPORT/: report.json (schema: docs/report-schema.md), report.md, speedup_mbsu.png,
acceptance_by_category.png, and records.jsonl (every generation, written as measured). Ctrl-C writes what
was measured so far, marked "partial": true; --resume continues a run that was interrupted or killed.

--prompts FILE uses the whole file unless --split says otherwise; the built-in humaneval set defaults to
its test split (disjoint from the calib split `edgespec calibrate` uses).

examples:
  edgespec bench --bundle bundles/qwen-coder --prompts humaneval --split test --limit 20 \\
      --strategies ar,tli --draft-length 2,4,6 --max-new-tokens 128 --repeats 3 --report out/bench
  edgespec bench --bundle B --prompts spec_bench.jsonl --category coding,math --strategies ar,tli,rdk-taylor \\
      --draft-length 1,2,4 --ep cuda --draft-ep cpu --report out/cuda
  edgespec bench --bundle B --prompts my.jsonl --strategies ar,tli,ngram --draft-length 2,4,auto --report out/auto
"""


def _csv(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def _draft_lengths(text: str) -> list[int | str]:
    """Comma-separated draft lengths: integers and/or `auto` (the runtime's per-round governor)."""
    out: list[int | str] = []
    for t in _csv(text):
        if t.lower() == AUTO:
            out.append(AUTO)
            continue
        try:
            out.append(int(t))
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected comma-separated integers and/or auto, got {text!r}") from None
    return out


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
                              description="Benchmark a bundle: ar against each (strategy, draft length), interleaved "
                                          "per prompt, on one execution provider.",
                              epilog=BENCH_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_bundle_and_prompts(p, "bundle directory")
    p.add_argument("--category", type=_csv, help="comma-separated categories to keep (default all)")
    p.add_argument("--limit", type=int, help="at most this many prompts")
    p.add_argument("--strategies", type=_csv, default=["ar", "auto"],
                   help="comma-separated (default ar,auto); ar (the exact reference) is always measured, and "
                        "ar-fast (1-token steps, the speed baseline) too where the graph pads 1-token steps; "
                        "ngram (prompt lookup) needs no "
                        "drafter. NAME:KEY=VALUE[:...] sets options for that row only, e.g. "
                        "rdk-taylor:rdk_beta=1000,tli:draft_probability=auto")
    p.add_argument("--draft-length", type=_draft_lengths, default=["auto"],
                   help="comma-separated γ and/or auto (default auto); auto: the runtime chooses γ in 0..--max-draft-length "
                        "per round (an extra row per strategy)")
    p.add_argument("--max-draft-length", type=int,
                   help=f"largest γ auto may choose (default {DEFAULT_MAX_DRAFT_LENGTH}, or the largest numeric "
                        "--draft-length when larger)")
    p.add_argument("--strategy-option", action="append", metavar="KEY=VALUE",
                   help="strategy option passed to every decoder, e.g. rdk_beta=2 (repeatable)")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-k", type=int)
    p.add_argument("--top-p", type=float)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--chat", action="store_true", help="wrap prompts in the bundle's chat template")
    p.add_argument("--ep", default="cpu", help="execution provider (cpu, cuda, tensorrt, dml, qnn, openvino, ...)")
    p.add_argument("--draft-ep", help="drafter's execution provider (default: --ep)")
    p.add_argument("--threads", type=int, help="ORT intra-op threads (default: the runtime's)")
    p.add_argument("--draft-threads", type=int, help="drafter's intra-op threads (default: --threads)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--no-warmup", action="store_true", help="skip the warm-up generations")
    p.add_argument("--bandwidth-mb", type=int, default=256, help="stream-test array size in MiB (0: skip)")
    p.add_argument("--verify", choices=["full", "fast", "none"], default="fast", help="bundle hash check (default fast)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--report", type=Path, required=True, metavar="OUT", help="report directory")
    p.add_argument("--peers", action="store_true",
                   help="also run onnxruntime-genai's generator on the same graph and prompts, interleaved, as a "
                        "row of the report (greedy, CPU EP, builder bundles)")
    p.add_argument("--prefill-graph", choices=list(PREFILL_GRAPH_SETTINGS), default="auto",
                   help=PREFILL_GRAPH_HELP + "; built up front, for every edgespec row, ar included")
    p.add_argument("--resume", action="store_true",
                   help="continue the run journaled in OUT/records.jsonl (same settings; --limit/--repeats may grow)")
    p.set_defaults(func=run_bench)


def bench_settings(args) -> BenchSettings:
    return BenchSettings(
        bundle=args.bundle, report=args.report, prompts=args.prompts, split=args.split, categories=args.category,
        limit=args.limit, strategies=args.strategies, draft_lengths=args.draft_length,
        max_draft_length=args.max_draft_length,
        max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
        seed=args.seed, ep=args.ep, draft_ep=args.draft_ep, threads=args.threads, draft_threads=args.draft_threads,
        repeats=args.repeats, warmup=not args.no_warmup, chat=args.chat, options=parse_options(args.strategy_option),
        bandwidth_mb=args.bandwidth_mb, verify=args.verify, progress=not args.quiet, resume=args.resume,
        peers=args.peers, prefill_graph=PREFILL_GRAPH_SETTINGS[args.prefill_graph], command=_command())


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
