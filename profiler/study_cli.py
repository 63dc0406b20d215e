"""`edgespec study acceptance` arguments (see profiler/study.py for the method)."""
from __future__ import annotations

import argparse
from pathlib import Path

EPILOG = """\
outputs in OUT/: acceptance.csv, acceptance.png (α against the fraction pruned, one line per sampler),
study.json, and with --bundle vocabtrim.png (expected τ and MBSU(c_params) of TLI against K).

examples:
  edgespec study acceptance --bundle bundles/qwen-coder --prompts humaneval --out out/study
  edgespec study acceptance --bundle bundles/qwen-smollm --text '/usr/lib/python3.11/json/*.py' \\
      --kept 1,5,25,100 --betas 1,1e5,1e6 --positions 1000 --out out/study-smollm
"""


def register_acceptance(sub, csv_list, float_list, command) -> None:
    p = sub.add_parser("acceptance", help="expected acceptance of masked/TLI/RDK samplers under vocabulary pruning",
                       description="Teacher-forced over held-out text with the drafter's FULL head: α = Σ min(p, q) "
                                   "of each sampler at each kept size (pruning = column masking, exact).",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    m = p.add_argument_group("models")
    m.add_argument("--bundle", type=Path, help="bundle (target graph, tokenizers, maps; full drafter from the "
                                               "export cache, else torch)")
    m.add_argument("--pair", help="pair recipe (torch models, no bundle needed)")
    m.add_argument("--target", help="target model source (with --drafter)")
    m.add_argument("--drafter", help="drafter model source")
    m.add_argument("--export-cache", type=Path, help="export cache holding the unpruned drafter graph "
                                                     "(default: edgespec's cache)")
    m.add_argument("--ep", default="cpu")
    m.add_argument("--threads", type=int, default=1)
    t = p.add_argument_group("text")
    t.add_argument("--prompts", default="humaneval", help="calib split calibrates, test split is held out "
                                                           "(default humaneval)")
    t.add_argument("--text", nargs="+", default=[], metavar="PATH_OR_GLOB",
                   help="raw text instead of --prompts (alternate excerpts calibrate / are held out)")
    t.add_argument("--positions", type=int, default=2000, help="held-out positions (default 2000)")
    t.add_argument("--calib-positions", type=int, default=2000, help="calibration positions (default 2000)")
    t.add_argument("--max-len", type=int, default=256, help="tokens per sequence (default 256)")
    s = p.add_argument_group("samplers")
    s.add_argument("--kept", type=float_list, default=[1, 2, 5, 10, 25, 50, 75, 100],
                   help="kept sizes in %% of the drafter vocabulary (default 1,2,5,10,25,50,75,100)")
    s.add_argument("--betas", type=float_list, default=[1, 1e3, 1e4, 1e5, 1e6, 1e7],
                   help="rdk-taylor strengths β (1 = Eq. 3 as printed; default 1,1e3,...,1e7)")
    s.add_argument("--estimators", type=csv_list, default=["cooc", "cov"], help="M estimators (default cooc,cov)")
    s.add_argument("--affinity-topk", type=int, default=32)
    s.add_argument("--affinity-tau", type=float, default=0.1)
    s.add_argument("--temperature", type=float, default=1.0)
    s.add_argument("--gamma", type=int, default=4, help="draft length of the VocabTrim view (default 4)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quiet", action="store_true")
    p.add_argument("--out", type=Path, required=True, metavar="OUT")
    p.set_defaults(func=lambda args: run(args, command))


def run(args, command) -> int:
    # lazy: the parser is built for every `edgespec` command; the study pulls NumPy, ONNX Runtime and
    # tokenizers (heavy third-party imports) only when it runs
    from edgespec.profiler.study import StudyConfig, run_study
    from edgespec.profiler.study_report import table

    cfg = StudyConfig(out=args.out, bundle=args.bundle, pair=args.pair, target=args.target, drafter=args.drafter,
                      prompts=None if args.text else args.prompts, text=args.text, kept_percent=args.kept,
                      betas=args.betas, estimators=args.estimators, affinity_topk=args.affinity_topk,
                      affinity_tau=args.affinity_tau, positions=args.positions, calib_positions=args.calib_positions,
                      max_len=args.max_len, temperature=args.temperature, gamma=args.gamma,
                      export_cache=args.export_cache, ep=args.ep, threads=args.threads, seed=args.seed,
                      progress=not args.quiet, command=command())
    doc = run_study(cfg)
    print(table(doc))
    print(f"\nstudy: {Path(args.out) / 'acceptance.csv'}")
    return 0
