"""`edgespec chat`: an interactive chat with a bundle in the terminal (no server, no starlette).

Each turn renders the whole conversation with the bundle's chat template and streams the reply.
Commands: /reset (forget the conversation), /stats (the last turn's strategy, acceptance, tau and
tok/s), /help, /exit (or Ctrl-D). Ctrl-C during a reply stops that reply (the part shown stays in the
conversation) and returns to the prompt; Ctrl-C at the prompt clears the line.
"""
from __future__ import annotations

import signal
import sys

from edgespec.errors import EdgespecError, GenerationError
from edgespec.runtime.bundle.bundle import Bundle
from edgespec.runtime.api.checks import check_generation_args
from edgespec.serve.server import make_decoder

HELP = "commands: /reset (new conversation), /stats (last turn's figures), /help, /exit (or Ctrl-D)"


def stats_line(stats) -> str:
    acc = "-" if stats.acceptance_rate is None else f"{stats.acceptance_rate:.2f}"
    tau = "-" if stats.tau is None else f"{stats.tau:.2f}"
    gamma = stats.draft_length if isinstance(stats.draft_length, int) else f"{stats.draft_length:.2f}"
    return (f"[{stats.strategy} draft length {gamma}: {stats.new_tokens} tokens, acceptance {acc}, tau {tau}, "
            f"{stats.decode_tokens_per_s:.1f} tok/s decode, {stats.tokens_per_s:.1f} tok/s end to end, "
            f"ttft {stats.ttft_ms:.0f} ms]")


class _Interrupt:
    """While a reply streams, Ctrl-C sets a flag (checked between rounds) instead of raising inside ORT."""

    def __init__(self):
        self.hit = False

    def __enter__(self):
        self.hit = False
        self._old = signal.signal(signal.SIGINT, self._on)
        return self

    def _on(self, *_):
        self.hit = True

    def __exit__(self, *exc):
        signal.signal(signal.SIGINT, self._old)


def run_chat(args, stdin=None, out=None, err=None) -> int:
    stdin, out, err = stdin or sys.stdin, out or sys.stdout, err or sys.stderr
    check_generation_args(args.max_new_tokens, args.temperature, None, args.top_p, args.seed, None)
    bundle = Bundle.load(args.bundle, verify=args.verify)
    if not bundle.chat_template:
        raise GenerationError(f"bundle {bundle.path} has no chat template: use `edgespec generate` for plain "
                              "completion")
    dec = make_decoder(bundle, args)
    tty = stdin.isatty()
    system = [{"role": "system", "content": args.system}] if args.system else []
    history: list[dict] = list(system)
    last = None
    if tty:
        print(f"edgespec chat with {bundle.path.name} ({dec.strategy.name}); {HELP}", file=err)
    try:
        while True:
            try:
                line = _read_line(tty, stdin)
            except KeyboardInterrupt:
                out.write("\n")
                continue
            if not line:
                break
            text = line.rstrip("\n")
            cmd = text.strip()
            if not cmd:
                continue
            if cmd in ("/exit", "/quit", "/bye"):
                break
            if cmd == "/reset":
                history = list(system)
                print("[conversation reset]", file=err)
                continue
            if cmd == "/stats":
                print(stats_line(last.stats) if last else "[no turn yet]", file=err)
                continue
            if cmd in ("/help", "/?"):
                print(HELP, file=err)
                continue
            if cmd.startswith("/"):
                print(f"[unknown command {cmd.split()[0]}; {HELP}]", file=err)
                continue
            history.append({"role": "user", "content": text})
            last = _turn(dec, history, args, out, err)
            if last is None:
                history.pop()          # the turn could not run (context full...): forget it
            else:
                history.append({"role": "assistant", "content": last.text})
                if args.stats:
                    print(stats_line(last.stats), file=err)
    finally:
        dec.close()
    return 0


def _read_line(tty: bool, stdin) -> str:
    """One line ('' at the end of input); a terminal gets a prompt and line editing."""
    if not tty:
        return stdin.readline()
    try:
        import readline  # noqa: F401  # lazy: line editing and history for input(); absent on Windows
    except ImportError:
        pass
    try:
        return input(">>> ") + "\n"
    except EOFError:
        return ""


def _turn(dec, history, args, out, err):
    try:
        stream = dec.stream(history, max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                            top_p=args.top_p, seed=args.seed, chat=True)
    except EdgespecError as exc:
        print(f"edgespec: error: {exc}" + ("; /reset starts a new conversation" if "context" in str(exc) else ""),
              file=err)
        return None
    with _Interrupt() as stop:
        try:
            for delta in stream:
                out.write(delta)
                out.flush()
                if stop.hit:
                    break
        finally:
            stream.close()
    out.write("\n")
    out.flush()
    if stop.hit:
        print("[stopped]", file=err)
    return dec.last_result
