"""The `edgespec` command. Each subpackage registers its own subcommands through a
`register(subparsers)` function in its `cli` module. Those modules import edgespec's own modules
at module level; torch, transformers, onnx and onnxruntime are imported only where they are used,
so `edgespec --help` needs neither torch nor onnxruntime."""
from __future__ import annotations

import argparse
import importlib
import sys

from edgespec import __version__
from edgespec.errors import EdgespecError

# The module of each subcommand group, in the order `edgespec --help` lists them; one whose own
# subpackage is missing from an install is skipped.
_COMMAND_MODULES = [
    "edgespec.models.cli",      # models list|pull
    "edgespec.export.cli",      # export
    "edgespec.runtime.cli",     # generate
    "edgespec.runtime.doctor",  # doctor
    "edgespec.calibrate.cli",   # calibrate
    "edgespec.profiler.cli",    # bench, study, demo
    "edgespec.serve.cli",       # serve, chat
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="edgespec",
        description="Fast, lossless speculative decoding on edge devices (ONNX Runtime).",
    )
    parser.add_argument("--version", action="version", version=f"edgespec {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in _COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:  # a subpackage not built yet / not installed
            if exc.name and exc.name.startswith("edgespec"):
                continue
            raise
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    try:
        result = args.func(args)
    except EdgespecError as exc:
        print(f"edgespec: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("edgespec: interrupted", file=sys.stderr)
        return 130
    return int(result or 0)


if __name__ == "__main__":
    raise SystemExit(main())
