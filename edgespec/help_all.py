"""Expert flags: parsed as always, left out of a command's `--help` (one screen), listed by its `--help-all`.

`add_help_all(parser, expert, usage=..., more=...)` is called once a command's arguments are all added:
the flags named in `expert` keep their spelling, default and checks, and only their help moves to
`--help-all`, which prints the command's full help (every flag, the full usage line, and `more`: longer
examples or notes) and exits. generate, chat, serve and bench have `--option KEY=VALUE` instead
(runtime/arguments.py): their knobs are options of the decoder, not flags of their own.
"""
from __future__ import annotations

import argparse

HELP_ALL = "--help-all"


class _HelpAll(argparse.Action):
    """Restores the expert flags' help, the generated usage line and the longer epilog, prints, exits."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None, expert=(),
                 more=None):
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)
        self.expert, self.more = expert, more

    def __call__(self, parser, namespace, values, option_string=None):
        for action, text in self.expert:
            action.help = text
        parser.usage = None
        if self.more:
            parser.epilog = (parser.epilog or "").rstrip("\n") + "\n" + self.more
        parser.print_help()
        parser.exit()


def add_help_all(parser: argparse.ArgumentParser, expert, *, usage: str | None = None, more: str | None = None) -> None:
    """Hide the flags in `expert` (any of each one's spellings) from `--help` and add `--help-all`.
    `usage`: a short usage line for `--help` and error messages (`%(prog)s` is the command);
    `more`: text `--help-all` adds after the epilog. A flag the parser lacks is a ValueError."""
    hidden = []
    for flag in expert:
        action = parser._option_string_actions.get(flag)
        if action is None:
            raise ValueError(f"{parser.prog} has no flag {flag}")
        if action.help is not argparse.SUPPRESS:
            hidden.append((action, action.help))
            action.help = argparse.SUPPRESS
    if usage:
        parser.usage = usage
    parser.add_argument(HELP_ALL, action=_HelpAll, expert=hidden, more=more,
                        help=f"show the {len(hidden)} expert flags too, and exit")


def expert_flags(parser: argparse.ArgumentParser) -> list[str]:
    """The flags `--help-all` adds to `parser`'s help (the first spelling of each; none without it)."""
    action = parser._option_string_actions.get(HELP_ALL)
    return [a.option_strings[0] for a, _ in action.expert] if action else []
