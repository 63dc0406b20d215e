"""`edgespec export`: target + pruned drafter -> an ONNX bundle.

Quantization (export/quantize_bundle.py): `add_arguments(parser)` adds the --quantize* flags;
`builder_settings(args)` turns them into the model builder's precisions, and `transform_from_args(args)`
into None or a transform(bundle_root: Path) -> dict | None for optimum graphs. The transform runs inside
the temporary bundle directory after the export-time checks and before the file hashes and weight
statistics are computed, so quantized bundles stay atomic; the dict it returns is merged into the
manifest (e.g. {"target": {"quantization": {...}}}).
"""
from __future__ import annotations

from edgespec.errors import ExportError
from edgespec.export.bundle_writer import export_bundle
from edgespec.export.quantize_bundle import add_arguments, builder_settings, transform_from_args
from edgespec.export.server_vocab import KINDS, parse_kinds, write_server_vocab
from edgespec.help_all import add_help_all
from edgespec.models import get_pair

USAGE = ("%(prog)s (--pair NAME | --target SRC [--drafter SRC])\n"
         "         [--keep K | --vocab VOCAB.json] [--quantize SCHEME] [--ep EP]\n"
         "         [--out DIR] [options]")
# left out of --help, listed by --help-all (edgespec/help_all.py)
EXPERT = ("--block-size", "--drafter-block-size", "--accuracy-level",
          "--quantize-embedding", "--int4-algo")


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "export", help="export a target and a vocabulary-pruned drafter into an ONNX bundle",
        description="Export a target and a drafter to ONNX graphs with a KV cache (onnxruntime-genai's model "
                    "builder where it takes the architecture, optimum otherwise; fp32 unless --quantize), prune "
                    "the drafter's LM head to K kept tokens, and write them with the vocabulary maps as a bundle. "
                    "A model SRC is a recipe name, an HF directory, a GGUF file or a hub id.",
        epilog="quantization blocks, accuracy level and method: --help-all")
    p.add_argument("--pair", metavar="NAME", help="pair recipe (edgespec models list): --target, --drafter, --keep")
    p.add_argument("--target", metavar="SRC", help="target model source")
    p.add_argument("--drafter", metavar="SRC", help="drafter model source (none: a target-only bundle)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--keep", type=int, metavar="K", help="keep the first K drafter tokens (without calibration)")
    g.add_argument("--vocab", metavar="VOCAB.json", help="kept vocabulary from `edgespec calibrate`")
    p.add_argument("--graph", choices=("builder", "optimum"), default=None, metavar="builder|optimum",
                   help="graphs from onnxruntime-genai's model builder (default where it takes the "
                        "architecture: fused attention, shared KV cache) or optimum (any HF causal LM)")
    p.add_argument("--out", metavar="DIR", help="bundle directory (default: bundles/<pair>)")
    p.add_argument("--quiet", action="store_true", help="no progress messages")
    p.add_argument("--also-write", default=None, metavar="KIND[,KIND]",
                   help=f"the kept vocabulary for server engines too, in BUNDLE/vocab/: {', '.join(KINDS)}")
    add_arguments(p)
    add_help_all(p, EXPERT, usage=USAGE)
    p.set_defaults(func=run)


def run(args) -> int:
    pair = None
    target, drafter, keep = args.target, args.drafter, args.keep
    if args.pair:
        pair = get_pair(args.pair)
        target = target or pair.target
        drafter = drafter or pair.drafter
        if keep is None and args.vocab is None:
            keep = pair.keep
    if not target:
        raise ExportError("give --pair NAME, or --target SRC (with --drafter SRC for a pair)")
    if drafter and keep is None and args.vocab is None:
        raise ExportError("give --keep K or --vocab VOCAB.json")
    also = parse_kinds(args.also_write)      # checked before the export runs
    if also and not drafter:
        raise ExportError("--also-write needs a pair (a drafter with a kept vocabulary)")
    out = args.out or (f"bundles/{pair.name}" if pair else None)
    if not out:
        raise ExportError("give --out DIR")
    builder = builder_settings(args) if args.graph != "optimum" else None
    transform = transform_from_args(args) if args.graph != "builder" else None
    path = export_bundle(target, drafter, out, keep=keep, vocab=args.vocab, pair=pair.name if pair else None,
                         progress=not args.quiet, transform=transform, graph=args.graph, builder=builder)
    for written in write_server_vocab(path, also):
        print(written)
    print(path)
    return 0
