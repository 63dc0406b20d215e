"""One set of decoder arguments (runtime/arguments.py) for generate, chat, serve and bench: its defaults
are SpeculativeDecoder's and DecodeConfig's, `--option KEY=VALUE` and `options=` reach the same
settings, the spellings of the earlier release still work with a one-line warning, and every
command's help fits one screen (50 lines of at most 80 columns), its expert flags listed by --help-all
(edgespec/help_all.py)."""
from __future__ import annotations

import argparse
import io
import re
import warnings
from contextlib import redirect_stderr, redirect_stdout

import pytest

from edgespec.cli import build_parser, main
from edgespec.errors import GenerationError
from edgespec.help_all import add_help_all, expert_flags
from edgespec.profiler.cli import bench_settings
from edgespec.runtime import SpeculativeDecoder
from edgespec.runtime.arguments import DEFAULTS, decoder_settings
from edgespec.runtime.api.config import SESSION_OPTIONS, DecodeConfig, check_decoder_settings
from edgespec.runtime.round.strategies import get_strategy

MINIMAL = {"generate": ["--bundle", "B", "--prompt", "p"], "chat": ["--bundle", "B"], "serve": ["--bundle", "B"],
           "bench": ["--bundle", "B", "--report", "R"]}


def _parse(command: str, *extra: str):
    return build_parser().parse_args([command, *MINIMAL[command], *extra])


@pytest.mark.parametrize("command", ["generate", "chat", "serve"])
def test_cli_defaults_are_the_decoders(command):
    settings = decoder_settings(_parse(command))
    assert settings == {**DEFAULTS, "options": {}}          # SpeculativeDecoder's own defaults, keyword by keyword
    config, session = check_decoder_settings(**settings)
    assert config == DecodeConfig(get_strategy("auto"))     # and with them, DecodeConfig's
    assert session == SESSION_OPTIONS


def test_bench_defaults_are_the_decoders():
    s = bench_settings(_parse("bench"))
    assert (s.ep, s.threads, s.prefill_graph) == (DEFAULTS["ep"], DEFAULTS["threads"], DEFAULTS["prefill_graph"])
    assert (s.draft_ep, s.draft_threads) == (SESSION_OPTIONS["draft_ep"], SESSION_OPTIONS["draft_threads"])
    assert s.max_draft_length == DecodeConfig(get_strategy("auto")).max_draft_length and s.options == {}


def test_option_reaches_the_settings_and_bench_keeps_its_own():
    args = _parse("generate", "--option", "drafter_window=none", "--option", "plain_steps=fast", "--option",
                  "draft_ep=cpu,cuda", "--option", "draft_confidence=0.5", "--option", "rdk_beta=2")
    config, session = check_decoder_settings(**decoder_settings(args))
    assert (config.drafter_window, config.plain_steps, config.draft_confidence) == (None, "fast", 0.5)
    assert dict(config.options) == {"rdk_beta": 2} and session["draft_ep"] == ["cpu", "cuda"]
    s = bench_settings(_parse("bench", "--option", "max_draft_length=4", "--option", "draft_threads=1",
                              "--option", "concurrent_draft=false"))
    assert (s.max_draft_length, s.draft_threads, s.options) == (4, 1, {"concurrent_draft": False})


@pytest.mark.parametrize("command, old, option", [
    ("generate", ["--drafter-window", "all"], ("drafter_window", None)),
    ("generate", ["--max-draft-length", "4"], ("max_draft_length", 4)),
    ("generate", ["--draft-ep", "cpu"], ("draft_ep", "cpu")),
    ("bench", ["--strategy-option", "rdk_beta=2"], ("rdk_beta", 2)),
    ("bench", ["--draft-threads", "1"], ("draft_threads", 1)),
])
def test_deprecated_flags_still_work_with_one_warning_line(command, old, option):
    err = io.StringIO()
    with redirect_stderr(err):
        args = _parse(command, *old)
    assert args.option == [option]
    lines = err.getvalue().splitlines()
    assert len(lines) == 1 and "deprecated" in lines[0] and f"--option {option[0]}=" in lines[0]


def test_a_deprecated_flag_with_a_bad_value_is_an_argument_error(capsys):
    with pytest.raises(SystemExit):
        _parse("bench", "--strategy-option", "rdk_beta")
    assert "argument --strategy-option: expected KEY=VALUE" in capsys.readouterr().err


def test_bad_option_is_one_line_before_the_bundle_loads(tmp_path, capsys):
    for extra, message in ((["--option", "drafter_windw=3"], "did you mean 'drafter_window'"),
                           (["--option", "drafter_window=1"], "drafter_window must be an integer >= 2"),
                           (["--draft-length", "x"], "draft_length must be an integer in"),
                           (["--draft-probability", "lots"], "draft_probability must be in (0, 1]")):
        rc = main(["generate", "--bundle", str(tmp_path / "missing"), "--prompt", "hi", *extra])
        err = capsys.readouterr().err.strip()
        assert rc == 2 and message in err and len(err.splitlines()) == 1, err


def _commands(parser=None, words=()):
    """(words, parser) of `edgespec` and every subcommand under it, found in the parser itself."""
    parser = parser or build_parser()
    yield words, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _commands(sub, (*words, name))


COMMANDS = [words for words, _ in _commands()]
SCREEN_LINES, SCREEN_COLUMNS = 50, 80


def _help(words, flag, monkeypatch) -> str:
    monkeypatch.setenv("COLUMNS", str(SCREEN_COLUMNS))
    out = io.StringIO()
    with pytest.raises(SystemExit) as exited, redirect_stdout(out):
        build_parser().parse_args([*words, flag])
    assert exited.value.code == 0
    return out.getvalue()


def _mentions(text: str, flag: str) -> bool:
    return re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", text) is not None


def test_every_command_is_checked():
    assert {("export",), ("calibrate",), ("study", "acceptance"), ("demo",), ("generate",), ("chat",), ("serve",),
            ("bench",), ("models", "pull")} <= set(COMMANDS)


@pytest.mark.parametrize("words", COMMANDS, ids=" ".join)
def test_help_fits_one_screen(words, monkeypatch):
    lines = _help(words, "--help", monkeypatch).splitlines()
    assert 3 < len(lines) <= SCREEN_LINES, len(lines)
    assert [line for line in lines if len(line) > SCREEN_COLUMNS] == []
    assert not any(_mentions("\n".join(lines), flag) for flag in ("--drafter-window", "--strategy-option", "--draft-ep"))


@pytest.mark.parametrize("words", [w for w, parser in _commands() if expert_flags(parser)], ids=" ".join)
def test_help_all_lists_the_flags_help_leaves_out(words, monkeypatch):
    parser = dict(_commands())[words]
    hidden, short, full = expert_flags(parser), _help(words, "--help", monkeypatch), _help(words, "--help-all", monkeypatch)
    assert hidden and _mentions(short, "--help-all")
    assert [flag for flag in hidden if _mentions(short, flag)] == []
    assert [flag for flag in hidden if not _mentions(full, flag)] == []
    shown = {s for a in parser._actions if a.help != argparse.SUPPRESS for s in a.option_strings}
    assert [flag for flag in shown if not _mentions(full, flag)] == []      # everything, not only the expert flags


@pytest.mark.parametrize("words, extra, dest, value", [
    (("calibrate",), ["--tf-positions", "64", "--lambda", "0.5"], "tf_positions", 64),
    (("export",), ["--int4-algo", "rtn", "--block-size", "64"], "int4_algo", "rtn"),
    (("study", "acceptance"), ["--gamma", "2", "--export-cache", "C"], "gamma", 2),
    (("demo",), ["--quality-tokens", "512"], "quality_tokens", 512),
    (("bench",), ["--bandwidth-mb", "0", "--no-warmup"], "bandwidth_mb", 0),
])
def test_expert_flags_parse_as_before(words, extra, dest, value):
    required = {"calibrate": ["--source", "raw", "--keep", "8", "--out", "v.json"], "bench": MINIMAL["bench"][0:4],
                "acceptance": ["--out", "O"]}.get(words[-1], [])
    args = build_parser().parse_args([*words, *required, *extra])
    assert getattr(args, dest) == value


def test_help_all_refuses_a_flag_the_command_lacks():
    parser = argparse.ArgumentParser(prog="x")
    parser.add_argument("--known")
    with pytest.raises(ValueError, match="x has no flag --unknown"):
        add_help_all(parser, ("--known", "--unknown"))


def test_api_options_and_deprecated_keywords_make_the_same_decoder(tiny_same_bundle):
    with warnings.catch_warnings():
        warnings.simplefilter("error")                     # the options= form warns about nothing
        new = SpeculativeDecoder(tiny_same_bundle, strategy="tli", draft_length=2, threads=1,
                                 options={"drafter_window": 16, "plain_steps": "fast", "draft_threads": 1,
                                          "defer_drafter": False})
    with pytest.warns(DeprecationWarning) as caught:
        old = SpeculativeDecoder(tiny_same_bundle, strategy="tli", draft_length=2, threads=1, drafter_window=16,
                                 plain_steps="fast", draft_threads=1, defer_drafter=False)
    assert len(caught) == 1 and "options=" in str(caught[0].message) and "\n" not in str(caught[0].message)
    assert caught[0].filename == __file__                   # it points at the caller's line
    assert old.config == new.config
    assert new.config.drafter_window == 16 and not new.drafter.pending     # defer_drafter=False: built now
    prompt = "The quick brown fox"
    assert new.generate(prompt, max_new_tokens=12).token_ids == old.generate(prompt, max_new_tokens=12).token_ids


def test_api_signature_is_small_and_checks_options(tiny_same_bundle):
    import inspect

    named = [n for n, p in inspect.signature(SpeculativeDecoder).parameters.items()
             if p.kind is not p.VAR_KEYWORD and n != "options"]
    assert len(named) <= 8, named
    with pytest.raises(GenerationError, match="options must be a mapping"):
        SpeculativeDecoder(tiny_same_bundle, options=["drafter_window"])
    with pytest.raises(GenerationError, match="unknown option 'plain_step'; did you mean 'plain_steps'"):
        SpeculativeDecoder(tiny_same_bundle, options={"plain_step": "fast"})
