"""`edgespec calibrate`: token counts -> kept drafter vocabulary (vocab.json) + the samplers' priors."""
from __future__ import annotations

import argparse
import shlex
from pathlib import Path

from edgespec.calibrate.run import CalibrationConfig, calibrate

EPILOG = """\
outputs, next to VOCAB.json (written atomically: an interrupted run leaves none of them):
  VOCAB.json            kept drafter ids, tokenizer hash, provenance (for `edgespec export --vocab`)
  VOCAB.priors/         prior.npy, counts.npz [, affinity.npz + affinity.json] [, randomised.json]
  VOCAB.coverage.json   coverage against K (+ held-out curves), and VOCAB.coverage.png

examples:
  edgespec calibrate --pair smollm-self --source raw --data '/usr/lib/python3.11/**/*.py' --keep 8192 --out v.json
  edgespec calibrate --pair qwen-coder --bundle B --source target --prompts humaneval --split calib \\
      --max-tokens 4000 --keep 32768 --affinity cooc --a-star --out v.json
  edgespec export --target qwen2.5-coder-1.5b --quantize int4 --quality-tokens 0 --out target-int4
  edgespec calibrate --pair qwen-coder --target-bundle target-int4 --source target --prompts humaneval \
      --threads 2 --keep 32768 --out v.json      # then: edgespec export --pair qwen-coder --vocab v.json ...
  edgespec calibrate --pair qwen-coder --source raw target --mix 1 1 --data 'DIR/**/*.py' \\
      --prompts humaneval --keep 32768 --out v.json
"""


def register(subparsers) -> None:
    p = subparsers.add_parser("calibrate", help="count tokens, choose the kept drafter vocabulary, build priors",
                              description=__doc__, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    m = p.add_argument_group("models")
    m.add_argument("--pair", help="pair recipe (edgespec models list)")
    m.add_argument("--target", help="target model source (recipe, HF dir, GGUF)")
    m.add_argument("--drafter", help="drafter model source")
    m.add_argument("--bundle", type=Path, help="run the models through this bundle's ONNX graphs (no torch)")
    m.add_argument("--target-bundle", type=Path, metavar="DIR",
                   help="generate the target source with this bundle's ONNX target (a target-only bundle is "
                        "enough: `edgespec export --target T --quantize int4`), tokenizers from --pair; no torch")
    m.add_argument("--ep", default="cpu", help="execution provider for --bundle/--target-bundle (default cpu)")
    m.add_argument("--threads", type=int, default=1, help="ORT intra-op threads (default 1)")
    s = p.add_argument_group("counting")
    s.add_argument("--source", nargs="+", required=True, choices=["raw", "target", "drafter"],
                   help="one or more sources; several are mixed")
    s.add_argument("--mix", nargs="+", type=float, help="weights of the sources (on normalised frequencies)")
    s.add_argument("--data", nargs="+", default=[], metavar="PATH_OR_GLOB",
                   help="raw corpus: files, directories, globs (** recursive); .gz and .jsonl[.gz] read")
    s.add_argument("--jsonl-field", default="text", help="field of .jsonl records holding the text (default text)")
    s.add_argument("--max-raw-tokens", type=int, help="stop counting raw text after this many tokens")
    s.add_argument("--prompts", help="prompt set for generated sources: humaneval or FILE.jsonl")
    s.add_argument("--split", default="calib", choices=["calib", "test", "all"], help="prompt split (default calib)")
    s.add_argument("--max-tokens", type=int, default=4096, help="generated-token budget per source (default 4096)")
    s.add_argument("--max-new-tokens", type=int, default=256, help="per prompt (default 256)")
    s.add_argument("--temperature", type=float, default=0.7, help="generation temperature, 0 = greedy (default 0.7)")
    s.add_argument("--top-p", type=float, help="nucleus sampling for generation")
    s.add_argument("--chat", choices=["auto", "on", "off"], default="auto",
                   help="wrap prompts in the chat template (auto: when the model has one)")
    s.add_argument("--save-text", type=Path, help="write the generated texts (jsonl) here, e.g. for --heldout")
    s.add_argument("--generated", nargs="+", default=[], metavar="FILE",
                   help="reuse --save-text files for the target/drafter sources instead of generating "
                        "(all their records; --max-tokens does not apply)")
    k = p.add_argument_group("kept vocabulary (one policy, or --vocab)").add_mutually_exclusive_group(required=True)
    k.add_argument("--keep", type=int, metavar="K", help="top-K by count (+ special tokens)")
    k.add_argument("--coverage", type=float, metavar="P", help="smallest set covering fraction P of the counts")
    k.add_argument("--min-count", type=float, metavar="C", help="every token counted at least C times")
    k.add_argument("--vocab", type=Path, metavar="VOCAB.json",
                   help="reuse this kept set (same drafter tokenizer) and compute priors for it")
    p.add_argument("--heldout", nargs="+", default=[], metavar="PATH_OR_GLOB",
                   help="held-out text (or a --save-text jsonl) to report coverage on")
    r = p.add_argument_group("priors")
    r.add_argument("--prior-alpha", type=float, default=0.5, help="add-alpha smoothing of the unigram prior")
    r.add_argument("--affinity", choices=["cooc", "cov"], help="estimate the RDK affinity M")
    r.add_argument("--affinity-topk", type=int, default=32, help="entries per row of M (default 32)")
    r.add_argument("--affinity-tau", type=float, default=0.1, help="cov: temperature relative to each row's max")
    r.add_argument("--affinity-identity", default="auto", metavar="auto|W",
                   help="shrink M toward the identity by W (auto: best held-out acceptance)")
    r.add_argument("--a-star", action="store_true", help="solve for the randomised-drafting probability a*")
    r.add_argument("--lambda", dest="lam", type=float, help="drafter/target step-time ratio (default: measured)")
    r.add_argument("--prior-temperature", type=float, default=1.0, help="temperature of p and q' for M and a*")
    r.add_argument("--tf-positions", type=int, default=2048, help="teacher-forced positions for M and a*")
    r.add_argument("--tf-max-len", type=int, default=512, help="tokens per teacher-forced sequence")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.add_argument("--out", type=Path, required=True, metavar="VOCAB.json",
                   help="the kept-vocabulary file to write (its directory is created if missing)")
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
