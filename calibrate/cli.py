"""`edgespec calibrate`: token counts -> kept drafter vocabulary (vocab.json) + the samplers' priors."""
from __future__ import annotations

import argparse
import shlex
from pathlib import Path

from edgespec.calibrate.run import CalibrationConfig, calibrate
from edgespec.help_all import add_help_all

EPILOG = """\
outputs, all or none (written atomically); examples: --help-all
  VOCAB.json        kept drafter ids, tokenizer hash, provenance (for export)
  VOCAB.priors/     prior.npy, counts.npz [, affinity.npz/json, randomised.json]
  VOCAB.coverage.*  json: coverage against K (+ held-out curves); png: its plot
"""
MORE_EXAMPLES = """
examples:
  edgespec calibrate --pair qwen-coder --target-bundle target-int4 --source target --prompts humaneval \\
      --threads 2 --keep 32768 --out v.json      # then: edgespec export --pair qwen-coder --vocab v.json ...
  edgespec calibrate --pair smollm-self --source raw --data '/usr/lib/python3.11/**/*.py' --keep 8192 --out v.json
  edgespec calibrate --pair qwen-coder --bundle B --source target --prompts humaneval --split calib \\
      --max-tokens 4000 --keep 32768 --affinity cooc --a-star --out v.json
  edgespec export --target qwen2.5-coder-1.5b --quantize int4 --quality-tokens 0 --out target-int4
      (a target-only bundle, for --target-bundle above)
  edgespec calibrate --pair qwen-coder --source raw target --mix 1 1 --data 'DIR/**/*.py' \\
      --prompts humaneval --keep 32768 --out v.json
"""
USAGE = ("%(prog)s [--pair NAME] --source SRC [SRC ...]\n"
         "         (--keep K | --coverage P | --min-count C | --vocab VOCAB.json)\n"
         "         --out VOCAB.json [options]")
# left out of --help, listed by --help-all (edgespec/help_all.py)
EXPERT = ("--jsonl-field", "--max-raw-tokens", "--top-p", "--chat", "--save-text", "--generated", "--prior-alpha",
          "--affinity-topk", "--affinity-tau", "--affinity-identity", "--lambda", "--prior-temperature",
          "--tf-positions", "--tf-max-len", "--seed")


def register(subparsers) -> None:
    p = subparsers.add_parser("calibrate", help="count tokens, choose the kept drafter vocabulary, build priors",
                              description="Token counts -> the kept drafter vocabulary and the samplers' priors.",
                              epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    m = p.add_argument_group("models")
    m.add_argument("--pair", metavar="NAME", help="pair recipe (edgespec models list)")
    m.add_argument("--target", metavar="SRC", help="target model source (recipe, HF dir, GGUF)")
    m.add_argument("--drafter", metavar="SRC", help="drafter model source")
    m.add_argument("--bundle", type=Path, metavar="DIR", help="run the models on this bundle's graphs (no torch)")
    m.add_argument("--target-bundle", type=Path, metavar="DIR",
                   help="generate with this target-only bundle (no torch)")
    m.add_argument("--ep", default="cpu", help="EP of --bundle/--target-bundle (default cpu)")
    m.add_argument("--threads", type=int, default=1, metavar="N", help="ORT intra-op threads (default 1)")
    s = p.add_argument_group("counting")
    s.add_argument("--source", nargs="+", required=True, choices=["raw", "target", "drafter"], metavar="SRC",
                   help="raw, target and/or drafter; several are mixed")
    s.add_argument("--mix", nargs="+", type=float, metavar="W", help="weights of the sources (of their frequencies)")
    s.add_argument("--data", nargs="+", default=[], metavar="PATH",
                   help="raw corpus: files, dirs, globs (**), .gz, .jsonl")
    s.add_argument("--jsonl-field", default="text", metavar="NAME",
                   help="field of .jsonl records holding the text (default text)")
    s.add_argument("--max-raw-tokens", type=int, metavar="N", help="stop counting raw text after this many tokens")
    s.add_argument("--prompts", metavar="SET", help="humaneval or FILE.jsonl, for generated sources")
    s.add_argument("--split", default="calib", choices=["calib", "test", "all"], metavar="calib|test|all", help="prompt split (default calib)")
    s.add_argument("--max-tokens", type=int, default=4096, metavar="N",
                   help="generated-token budget per source (default 4096)")
    s.add_argument("--max-new-tokens", type=int, default=256, metavar="N", help="per prompt (default 256)")
    s.add_argument("--temperature", type=float, default=0.7, metavar="T",
                   help="0 = greedy (default 0.7)")
    s.add_argument("--top-p", type=float, metavar="P", help="nucleus sampling for generation")
    s.add_argument("--chat", choices=["auto", "on", "off"], default="auto",
                   help="wrap prompts in the chat template (auto: when the model has one)")
    s.add_argument("--save-text", type=Path, metavar="FILE",
                   help="write the generated texts (jsonl) here, e.g. for --heldout")
    s.add_argument("--generated", nargs="+", default=[], metavar="FILE",
                   help="reuse --save-text files for the target/drafter sources instead of generating "
                        "(all their records; --max-tokens does not apply)")
    k = p.add_argument_group("kept vocabulary (one policy, or --vocab)").add_mutually_exclusive_group(required=True)
    k.add_argument("--keep", type=int, metavar="K", help="top-K by count (+ special tokens)")
    k.add_argument("--coverage", type=float, metavar="P", help="smallest set covering fraction P of the counts")
    k.add_argument("--min-count", type=float, metavar="C", help="every token counted at least C times")
    k.add_argument("--vocab", type=Path, metavar="VOCAB.json", help="reuse this kept set; compute its priors")
    p.add_argument("--heldout", nargs="+", default=[], metavar="PATH",
                   help="held-out text or generated jsonl: coverage on it")
    r = p.add_argument_group("priors")
    r.add_argument("--prior-alpha", type=float, default=0.5, metavar="A", help="add-alpha smoothing of the unigram prior")
    r.add_argument("--affinity", choices=["cooc", "cov"], metavar="cooc|cov", help="estimate the RDK affinity M")
    r.add_argument("--affinity-topk", type=int, default=32, metavar="N", help="entries per row of M (default 32)")
    r.add_argument("--affinity-tau", type=float, default=0.1, metavar="T", help="cov: temperature relative to each row's max")
    r.add_argument("--affinity-identity", default="auto", metavar="auto|W",
                   help="shrink M toward the identity by W (auto: best held-out acceptance)")
    r.add_argument("--a-star", action="store_true", help="solve for the randomised-drafting probability a*")
    r.add_argument("--lambda", dest="lam", type=float, metavar="L", help="drafter/target step-time ratio (default: measured)")
    r.add_argument("--prior-temperature", type=float, default=1.0, metavar="T", help="temperature of p and q' for M and a*")
    r.add_argument("--tf-positions", type=int, default=2048, metavar="N", help="teacher-forced positions for M and a*")
    r.add_argument("--tf-max-len", type=int, default=512, metavar="N", help="tokens per teacher-forced sequence")
    p.add_argument("--seed", type=int, default=0, metavar="N")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.add_argument("--out", type=Path, required=True, metavar="VOCAB.json",
                   help="the kept-vocabulary file to write")
    add_help_all(p, EXPERT, usage=USAGE, more=MORE_EXAMPLES)
    p.set_defaults(func=run)


def command_line(args) -> str:
    """The command in explicit canonical form (every option, defaults included): it reproduces the run."""
    flags = {"lam": "--lambda", "source": "--source"}
    parts = ["edgespec", "calibrate"]
    for key, value in vars(args).items():
        if key in ("func", "command") or value is None or value is False or value == []:
            continue
        flag = flags.get(key, "--" + key.replace("_", "-"))
        if value is True:
            parts.append(flag)
        elif isinstance(value, list):
            parts += [flag, *map(str, value)]
        else:
            parts += [flag, str(value)]
    return shlex.join(parts)


def run(args) -> int:
    policy, value = next(((name, v) for name, v in (("keep", args.keep), ("coverage", args.coverage),
                                                     ("min-count", args.min_count)) if v is not None), (None, None))
    cfg = CalibrationConfig(
        out=args.out, sources=args.source, policy=policy, value=value, pair=args.pair, target=args.target,
        drafter=args.drafter, bundle=args.bundle, target_bundle=args.target_bundle, mix=args.mix, data=args.data, jsonl_field=args.jsonl_field,
        max_raw_tokens=args.max_raw_tokens, prompts=args.prompts, split=args.split, max_tokens=args.max_tokens,
        max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_p=args.top_p,
        chat={"auto": None, "on": True, "off": False}[args.chat], affinity=args.affinity,
        affinity_topk=args.affinity_topk, affinity_tau=args.affinity_tau, affinity_identity=args.affinity_identity, a_star=args.a_star, lam=args.lam,
        prior_alpha=args.prior_alpha, prior_temperature=args.prior_temperature, tf_positions=args.tf_positions,
        tf_max_len=args.tf_max_len, heldout=args.heldout, generated=args.generated, save_text=args.save_text,
        seed=args.seed, ep=args.ep,
        threads=args.threads, progress=not args.quiet, vocab=args.vocab, command=command_line(args))
    doc = calibrate(cfg)
    prov = doc["provenance"]
    line = f"kept {len(doc['kept_ids'])} tokens, coverage {prov['coverage']:.4f}"
    if prov.get("heldout_coverage") is not None:
        line += f", held-out coverage {prov['heldout_coverage']:.4f}"
    print(line)
    return 0
