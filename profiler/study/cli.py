"""`edgespec study acceptance` and `edgespec study synthetic` arguments (see profiler/study/acceptance.py and
profiler/study/synthetic.py for the methods)."""
from __future__ import annotations

import argparse
from pathlib import Path

from edgespec.calibrate.prompts import HUMANEVAL
from edgespec.help_all import add_help_all
from edgespec.profiler.study import randomised as study_randomised, report as study_report, synthetic as study_synthetic
from edgespec.profiler.study.acceptance import StudyConfig, run_study
from edgespec.profiler.study.randomised import RandomisedConfig, run_randomised
from edgespec.profiler.study.synthetic import DEFAULT_KEPT, DEFAULT_SCALE, SyntheticConfig, run_synthetic

def add_bundle_and_prompts(p, bundle_help: str) -> None:
    """--bundle, --prompts and --split, as `edgespec bench` and the randomised study read them."""
    p.add_argument("--bundle", type=Path, required=True, metavar="DIR", help=bundle_help)
    p.add_argument("--prompts", default=HUMANEVAL, metavar="SET",
                   help=f"{HUMANEVAL} (default) or FILE.jsonl")
    p.add_argument("--split", metavar="SPLIT", help="calib, test or all (default: test, or all of a FILE)")


EPILOG = """\
outputs in OUT/: acceptance.csv, acceptance.png (α against the fraction pruned,
one line per sampler), study.json, and with --bundle vocabtrim.png (expected τ
and MBSU(c_params) of TLI against K). The samplers' settings: --help-all.

examples:
  edgespec study acceptance --bundle bundles/qwen-coder --out out/study
"""
MORE_EXAMPLES = """  edgespec study acceptance --bundle bundles/qwen-smollm --text '/usr/lib/python3.11/json/*.py' \\
      --kept 1,5,25,100 --betas 1,1e5,1e6 --positions 1000 --out out/study-smollm
"""
# left out of `study acceptance --help`, listed by --help-all (edgespec/help_all.py)
ACCEPTANCE_EXPERT = ("--export-cache", "--calib-positions", "--max-len", "--affinity-topk",
                     "--affinity-tau", "--temperature", "--gamma", "--seed")


def register_acceptance(sub, csv_list, float_list, command) -> None:
    p = sub.add_parser("acceptance", help="expected acceptance of masked/TLI/RDK samplers under vocabulary pruning",
                       description="Teacher-forced over held-out text with the drafter's FULL head: α = Σ min(p, q)\n"
                                   "of each sampler at each kept size (pruning = column masking, exact).",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    m = p.add_argument_group("models")
    m.add_argument("--bundle", type=Path, metavar="DIR",
                   help="a bundle (its full drafter from the export cache, else torch)")
    m.add_argument("--pair", metavar="NAME", help="pair recipe (torch models, no bundle needed)")
    m.add_argument("--target", metavar="SRC", help="target model source (with --drafter)")
    m.add_argument("--drafter", metavar="SRC", help="drafter model source")
    m.add_argument("--export-cache", type=Path, metavar="DIR", help="export cache holding the unpruned drafter graph "
                                                                    "(default: edgespec's cache)")
    m.add_argument("--ep", default="cpu", help="execution provider (default cpu)")
    m.add_argument("--threads", type=int, default=1, metavar="N", help="ORT intra-op threads (default 1)")
    t = p.add_argument_group("text")
    t.add_argument("--prompts", default="humaneval", metavar="SET",
                   help="calib split calibrates, test is held out (default humaneval)")
    t.add_argument("--text", nargs="+", default=[], metavar="PATH",
                   help="raw text instead (alternate excerpts calibrate / are held out)")
    t.add_argument("--positions", type=int, default=2000, metavar="N", help="held-out positions (default 2000)")
    t.add_argument("--calib-positions", type=int, default=2000, metavar="N",
                   help="calibration positions (default 2000)")
    t.add_argument("--max-len", type=int, default=256, metavar="N", help="tokens per sequence (default 256)")
    s = p.add_argument_group("samplers")
    s.add_argument("--kept", type=float_list, default=[1, 2, 5, 10, 25, 50, 75, 100], metavar="LIST",
                   help="kept sizes, %% of the drafter vocabulary (default 1,2,5,...,100)")
    s.add_argument("--betas", type=float_list, default=[1, 1e3, 1e4, 1e5, 1e6, 1e7], metavar="LIST",
                   help="rdk-taylor strengths β (1 = Eq. 3 as printed; default 1,1e3,...,1e7)")
    s.add_argument("--estimators", type=csv_list, default=["cooc", "cov"], metavar="LIST",
                   help="M: cooc, cov (calibrated), prefix, first (default cooc,cov)")
    s.add_argument("--affinity-topk", type=int, default=32, metavar="N", help="entries per row of M (default 32)")
    s.add_argument("--affinity-tau", type=float, default=0.1, metavar="T",
                   help="cov: temperature relative to each row's max (default 0.1)")
    s.add_argument("--temperature", type=float, default=1.0, metavar="T", help="of p and q (default 1)")
    s.add_argument("--gamma", type=int, default=4, metavar="N", help="draft length of the VocabTrim view (default 4)")
    p.add_argument("--seed", type=int, default=0, metavar="N")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.add_argument("--out", type=Path, required=True, metavar="OUT", help="output directory")
    add_help_all(p, ACCEPTANCE_EXPERT, usage="%(prog)s [--bundle DIR | --pair NAME]\n"
                 "         [--prompts SET | --text PATH ...] --out OUT [options]", more=MORE_EXAMPLES)
    p.set_defaults(func=lambda args: run(args, command))


def run(args, command) -> int:
    cfg = StudyConfig(out=args.out, bundle=args.bundle, pair=args.pair, target=args.target, drafter=args.drafter,
                      prompts=None if args.text else args.prompts, text=args.text, kept_percent=args.kept,
                      betas=args.betas, estimators=args.estimators, affinity_topk=args.affinity_topk,
                      affinity_tau=args.affinity_tau, positions=args.positions, calib_positions=args.calib_positions,
                      max_len=args.max_len, temperature=args.temperature, gamma=args.gamma,
                      export_cache=args.export_cache, ep=args.ep, threads=args.threads, seed=args.seed,
                      progress=not args.quiet, command=command())
    doc = run_study(cfg)
    print(study_report.table(doc))
    print(f"\nlargest standard error of α: {doc['max_alpha_se']:.4f} ({doc['heldout_positions']} held-out positions)")
    print(f"\nstudy: {Path(args.out) / 'acceptance.csv'}")
    return 0


RANDOMISED_EPILOG = """\
outputs in OUT/: randomised.json (settings, per-a rows, per-prompt sums),
randomised.csv, randomised.png (acceptance measured vs Lemma 4.1 against a;
decode tokens/s against a). Method: docs/study-randomised.md.

examples:
  edgespec study randomised --bundle bundles/qwen-coder-int4 --limit 8 \\
      --max-new-tokens 64 --out out/randomised
"""


def register_randomised(sub, csv_list, float_list, command) -> None:
    p = sub.add_parser("randomised", help="randomised drafting: measured acceptance vs Lemma 4.1, tokens/s vs a",
                       description="Per prompt: ar and tli with draft_probability=a for each a (same seed);\n"
                                   "teacher-forced p and q give Lemma 4.1's prediction (randomised-drafting paper).",
                       epilog=RANDOMISED_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_bundle_and_prompts(p, "a same-tokenizer bundle")
    p.add_argument("--limit", type=int, default=8, help="prompts (default 8)")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--a", type=float_list, default=[0.25, 0.5, 0.75, 1.0], help="drafting probabilities "
                                                                                "(default 0.25,0.5,0.75,1)")
    p.add_argument("--draft-length", type=int, default=4)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, help="ORT intra-op threads (default: the runtime's)")
    p.add_argument("--no-warmup", action="store_true")
    p.add_argument("--quiet", action="store_true")
    p.add_argument("--out", type=Path, required=True, metavar="OUT")
    p.set_defaults(func=lambda args: run_randomised_cli(args, command))


def run_randomised_cli(args, command) -> int:
    cfg = RandomisedConfig(bundle=args.bundle, out=args.out, prompts=args.prompts, split=args.split,
                           limit=args.limit, max_new_tokens=args.max_new_tokens, a_values=args.a,
                           draft_length=args.draft_length, temperature=args.temperature, seed=args.seed,
                           threads=args.threads, warmup=not args.no_warmup, progress=not args.quiet,
                           command=command())
    doc = run_randomised(cfg)
    print(study_randomised.table(doc))
    if doc["sd_check"]:
        c = doc["sd_check"]
        print(f"\nLemma 4.1 at a=1 vs Σ min(p, q) on {c['positions']} positions: {c['lemma_at_1_mean']:.4f} vs "
              f"{c['sd_alpha_mean']:.4f} (max |diff| {c['max_abs_diff']:.1e})")
    print(f"\n{doc['prompts']} prompts, {doc['elapsed_s']} s; study: {Path(args.out) / 'randomised.json'}")
    return 0


SYNTHETIC_EPILOG = """\
outputs in OUT/: synthetic.json (settings, target statistics, rows),
synthetic.csv, synthetic.png (α against the kept tokens K, log x axis, with the
paper's 26.7 %). Method and results: docs/study-synthetic.md.

examples:
  edgespec study synthetic --out out/synthetic
  edgespec study synthetic --vocab 20000 --kept 100,1000,20000 --positions 200 \\
      --noise 1 --out out/syn-small
"""


def register_synthetic(sub, csv_list, float_list, command) -> None:
    p = sub.add_parser("synthetic", help="RDK paper Fig. 7: acceptance under pruning on synthetic Student-t "
                                         "targets (no models)",
                       description="Synthetic targets p = softmax(scale * t_df) over V tokens; the drafter q = p\n"
                                   "(or a noisy copy) pruned to its K most frequent tokens; α = Σ min(p, d) of\n"
                                   "masked, TLI, rdk-taylor (Eq. 3) and rdk (Algorithm 1) at each K.",
                       epilog=SYNTHETIC_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True, metavar="OUT", help="output directory")
    p.add_argument("--vocab", type=int, default=200_000, help="vocabulary size V (default 200000)")
    p.add_argument("--kept", type=float_list, default=DEFAULT_KEPT,
                   help="kept sizes K in tokens (default 500,1000,2000,5000,10000,20000,50000,100000,200000)")
    p.add_argument("--positions", type=int, default=1000, help="held-out positions (default 1000)")
    p.add_argument("--calib-positions", type=int, default=200,
                   help="positions for the frequency ranking, the prior and M (default 200)")
    p.add_argument("--df", type=float, default=5.0, help="Student t degrees of freedom (default 5, Fig. 3)")
    p.add_argument("--scale", type=float, default=DEFAULT_SCALE,
                   help=f"scale of the t logits (default {DEFAULT_SCALE:g}: median top-25%% mass 95.8%%, Fig. 5)")
    p.add_argument("--noise", type=float, default=0.0,
                   help="drafter = softmax(z + NOISE * N(0,1)); 0 = the target itself (default 0)")
    p.add_argument("--betas", type=float_list, default=[1.0], help="rdk-taylor strengths β (1 = Eq. 3 as printed)")
    p.add_argument("--estimators", type=csv_list, default=["cooc"], help="calibrated M for rdk: cooc, cov "
                                                                         "(default cooc; eq2 is always run)")
    p.add_argument("--tau", type=float, default=1.0, help="Eq. 2 temperature of M = eq2 (default 1)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(func=lambda args: run_synthetic_cli(args, command))


def run_synthetic_cli(args, command) -> int:
    cfg = SyntheticConfig(out=args.out, vocab=args.vocab, kept=[int(k) if k == int(k) else k for k in args.kept],
                          positions=args.positions, calib_positions=args.calib_positions, df=args.df,
                          scale=args.scale, noise=args.noise, betas=args.betas, estimators=args.estimators,
                          tau=args.tau, seed=args.seed, progress=not args.quiet, command=command())
    doc = run_synthetic(cfg)
    print(study_synthetic.table(doc))
    print(f"\nα ± SE in %, {doc['positions']} positions, {doc['elapsed_s']} s; paper (Fig. 7): RDK 26.7 %")
    print(f"study: {Path(args.out) / 'synthetic.json'}")
    return 0
