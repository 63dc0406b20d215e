"""`edgespec chat` as a user runs it (a subprocess fed through stdin) on the real smollm-self bundle:
greedy replies equal the in-process decoder's, /reset starts over, /stats and --stats print acceptance
and tok/s, Ctrl-C (SIGINT) stops a reply without leaving the chat, and a bundle without a chat template
is a one-line error."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from edgespec.runtime import Bundle, SpeculativeDecoder

pytestmark = pytest.mark.real

N = 16
Q1, Q2 = "What is the capital of France?", "And of Italy?"


@pytest.fixture(scope="module")
def bundle(request) -> Path:
    env = os.environ.get("EDGESPEC_SMOLLM_BUNDLE")
    return Path(env) if env else request.getfixturevalue("smollm_self_bundle")


@pytest.fixture(scope="module")
def ref(bundle):
    return SpeculativeDecoder(Bundle.load(bundle, verify="fast"), strategy="ar", draft_length=1, threads=1)


def chat_cmd(bundle, *extra):
    return [sys.executable, "-m", "edgespec", "chat", "--bundle", str(bundle), "--max-new-tokens", str(N), *extra]


def test_turns_reset_and_stats(bundle, ref):
    a1 = ref.generate([{"role": "user", "content": Q1}], max_new_tokens=N, chat=True).text
    a2 = ref.generate([{"role": "user", "content": Q1}, {"role": "assistant", "content": a1},
                       {"role": "user", "content": Q2}], max_new_tokens=N, chat=True).text
    assert "\n" not in a1 + a2, "pick questions whose short replies are one line"
    stdin = f"{Q1}\n{Q2}\n/stats\n/reset\n{Q1}\n/bogus\n/exit\nnever sent\n"
    p = subprocess.run(chat_cmd(bundle, "--stats"), input=stdin, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines() == [a1, a2, a1]          # the conversation carries over, /reset forgets it
    stats = [line for line in p.stderr.splitlines() if line.startswith("[") and "acceptance" in line]
    assert len(stats) == 4                                # --stats after each of 3 turns + /stats once
    assert all("tok/s" in line for line in stats)
    assert "[conversation reset]" in p.stderr and "unknown command /bogus" in p.stderr


def test_ctrl_c_stops_a_reply_and_the_chat_goes_on(bundle, ref):
    a1 = ref.generate([{"role": "user", "content": Q1}], max_new_tokens=N, chat=True).text
    p = subprocess.Popen(chat_cmd(bundle, "--max-new-tokens", "400"), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    p.stdin.write("Count from 1 to 500, one number per line.\n")
    p.stdin.flush()
    assert p.stdout.read(1)                               # the reply is streaming
    p.send_signal(signal.SIGINT)
    rest, err = p.communicate(input=f"/stats\n/reset\n{Q1}\n", timeout=300)
    out = "?" + rest
    assert p.returncode == 0, err
    assert "[stopped]" in err
    stopped = [line for line in err.splitlines() if line.startswith("[") and "acceptance" in line]
    assert len(stopped) == 1 and int(stopped[0].split(": ")[1].split()[0]) < 400   # /stats: the cut reply
    assert out.endswith("\n" + a1 + "\n")                  # after /reset, the same answer as a fresh chat


def test_a_bundle_without_chat_template_is_a_one_line_error(bundle, tmp_path):
    copy = tmp_path / "no-template"
    for src in Path(bundle).rglob("*"):
        dst = copy / src.relative_to(bundle)
        if src.is_dir():
            dst.mkdir(parents=True, exist_ok=True)
        elif not src.name.startswith("chat_template"):
            dst.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.link(src, dst)                          # big graphs: no copy
            except OSError:
                shutil.copy2(src, dst)
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["files"] = {k: v for k, v in manifest["files"].items() if "chat_template" not in k}
    (copy / "manifest.json").unlink()
    (copy / "manifest.json").write_text(json.dumps(manifest))
    assert Bundle.load(copy, verify="fast").chat_template is None
    p = subprocess.run(chat_cmd(copy), input="hi\n", capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and p.stdout == ""
    err = [line for line in p.stderr.splitlines() if not line.startswith("edgespec: checking")]   # the hash notice
    assert len(err) == 1 and "has no chat template" in err[0] and err[0].startswith("edgespec: error:"), p.stderr
