"""The decoder's command-line arguments: one set for `generate`, `chat`, `serve` and `bench`.

`add_decoder_arguments(parser)` adds the settings users need; their defaults are read from
`SpeculativeDecoder`'s signature and `DecodeConfig`, never restated. Everything else (the tuning knobs
and the strategy options of `SpeculativeDecoder(options=...)`, docs/runtime.md "Options") is one
repeatable `--option KEY=VALUE`. The values are checked where the API's are (DecodeConfig, the
sessions), so the command line and the library refuse the same things with the same one-line errors.
The flags of earlier releases (`--drafter-window N`, `--strategy-option K=V`, ...) still parse for one
release, hidden from the help, with a one-line warning on stderr.
"""
from __future__ import annotations

import argparse
import dataclasses
import inspect
import sys

from edgespec.runtime.bundle.bundle import DEFAULT_VERIFY, VERIFY_MODES, Bundle
from edgespec.runtime.api.config import PREFILL_GRAPH_SETTINGS, check_decoder_settings
from edgespec.runtime.api.decoder import SpeculativeDecoder
from edgespec.runtime.round.strategies import STRATEGIES



def defaults_of(obj) -> dict:
    """{name: default} of a dataclass's fields (a default_factory called) or a callable's parameters: a
    command's flags read the defaults of the settings they fill, so that each is written once."""
    if dataclasses.is_dataclass(obj):
        return {f.name: f.default if f.default is not dataclasses.MISSING else f.default_factory()
                for f in dataclasses.fields(obj)
                if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING}
    return {name: p.default for name, p in inspect.signature(obj).parameters.items()
            if p.default is not inspect.Parameter.empty}


DEFAULTS = defaults_of(SpeculativeDecoder)
PREFILL_GRAPH_WORDS = {value: word for word, value in PREFILL_GRAPH_SETTINGS.items()}
PREFILL_GRAPH_HELP = ("long prompts on the target's prefill graph, a second session: auto (512+ tokens, default), "
                      "on (96+), off")
# a flag of earlier releases -> the --option key it sets (each command names the ones it had; bench's
# --strategy-option took KEY=VALUE itself)
DEPRECATED_FLAGS = {"--drafter-window": "drafter_window", "--plain-steps": "plain_steps",
                    "--max-draft-length": "max_draft_length", "--draft-confidence": "draft_confidence",
                    "--draft-ep": "draft_ep", "--draft-threads": "draft_threads"}


def parse_draft_length(text: str) -> int | str:
    """`auto` or a whole number; anything else is passed on as text, for DecodeConfig's check to refuse
    in one line (as it refuses an out-of-range number)."""
    text = text.strip()
    if text.lower() == "auto":
        return "auto"
    try:
        return int(text)
    except ValueError:
        return text


def parse_value(text: str):
    """An option's value: true/false, none, an integer, a number, else the text itself."""
    lowered = text.strip().lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    if lowered == "none":
        return None
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def parse_option(text: str) -> tuple[str, object]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key.strip(), parse_value(value)


def parse_ep(value):
    """`--ep cuda` or a comma-separated list of ORT provider names."""
    if value is None or "," not in value:
        return value
    return [v.strip() for v in value.split(",") if v.strip()]


def _shown(value) -> str:
    """A value as --option spells it (parse_value's inverse)."""
    return "none" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


class _Deprecated(argparse.Action):
    """An earlier release's flag: warns once on stderr and adds its value to --option."""

    def __call__(self, parser, namespace, values, option_string=None):
        key = DEPRECATED_FLAGS.get(option_string, "")
        try:
            pairs = [parse_option(values)] if not key else [(key, None if values == "all" else parse_value(values))]
        except argparse.ArgumentTypeError as exc:
            raise argparse.ArgumentError(self, str(exc)) from None
        replacement = " ".join(f"--option {k}={_shown(v)}" for k, v in pairs)
        print(f"edgespec: warning: {option_string} is deprecated and will be removed in the next release: use "
              f"{replacement}", file=sys.stderr)
        namespace.option = [*(namespace.option or []), *pairs]


def add_decoder_arguments(p: argparse.ArgumentParser, *, rows: bool = False, deprecated=()) -> None:
    """--bundle, --strategy, --draft-length, --draft-probability and --allow-fallback (not for `rows`:
    bench, whose rows name their own strategies and draft lengths, and which measures the EP it is given),
    then --ep, --threads, --prefill-graph, --verify and --option; `deprecated`: this command's flags of
    earlier releases (DEPRECATED_FLAGS, or --strategy-option)."""
    if not rows:
        p.add_argument("--bundle", required=True, metavar="DIR", help="bundle directory (from `edgespec export`)")
        p.add_argument("--strategy", default=DEFAULTS["strategy"], metavar="NAME",
                       help=f"{', '.join(sorted(STRATEGIES))} (default auto: chosen for the bundle, "
                            "docs/samplers.md)")
        p.add_argument("--draft-length", type=parse_draft_length, default=DEFAULTS["draft_length"], metavar="K|auto",
                       help="draft tokens per verify (default auto: chosen per round, 0 where it does not pay)")
        p.add_argument("--draft-probability", type=parse_value, default=DEFAULTS["draft_probability"],
                       metavar="A|auto", help="randomised drafting with probability A in (0, 1] (auto: the bundle's a*)")
        p.add_argument("--allow-fallback", action="store_true", default=DEFAULTS["allow_fallback"],
                       help="run on the CPU if the requested EP is not active")
    p.add_argument("--ep", default=DEFAULTS["ep"], help="execution provider: cpu (default), cuda, dml, qnn, openvino, "
                                                       "... or ORT names, comma-separated")
    p.add_argument("--threads", type=int, default=DEFAULTS["threads"], metavar="N",
                   help="intra-op threads per session (default: the runtime's)")
    p.add_argument("--prefill-graph", choices=list(PREFILL_GRAPH_SETTINGS),
                   default=PREFILL_GRAPH_WORDS[DEFAULTS["prefill_graph"]], help=PREFILL_GRAPH_HELP)
    p.add_argument("--verify", choices=VERIFY_MODES, default=DEFAULT_VERIFY,
                   help=f"bundle file checks (default {DEFAULT_VERIFY})")
    p.add_argument("--option", type=parse_option, action="append", metavar="KEY=VALUE",
                   help="a tuning knob or strategy option, repeatable (docs/runtime.md, \"Options\")")
    for flag in deprecated:
        p.add_argument(flag, action=_Deprecated, help=argparse.SUPPRESS)


def decoder_options(args: argparse.Namespace) -> dict:
    """--option's pairs as `options=` (a later KEY wins; draft_ep as --ep reads it)."""
    options = dict(args.option or [])
    if isinstance(options.get("draft_ep"), str):
        options["draft_ep"] = parse_ep(options["draft_ep"])
    return options


def decoder_settings(args: argparse.Namespace, **changes) -> dict:
    """SpeculativeDecoder's keywords from the parsed arguments (`changes` override them)."""
    settings = dict(strategy=args.strategy, draft_length=args.draft_length, ep=parse_ep(args.ep), threads=args.threads,
                    draft_probability=args.draft_probability, prefill_graph=PREFILL_GRAPH_SETTINGS[args.prefill_graph],
                    allow_fallback=args.allow_fallback, options=decoder_options(args))
    settings.update(changes)
    return settings


def decoder_from_args(args: argparse.Namespace, bundle: Bundle | None = None, **changes) -> SpeculativeDecoder:
    """The decoder the arguments describe (on `bundle`, else on --bundle loaded with --verify); its
    settings are checked before the bundle loads."""
    settings = decoder_settings(args, **changes)
    check_decoder_settings(**settings)
    return SpeculativeDecoder(bundle or Bundle.load(args.bundle, verify=args.verify), **settings)
