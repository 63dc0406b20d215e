"""The project speaks of itself with dates and commit ids: no numbered-stop wording (the word stop, or
stops, and a number) in any tracked text file (README, docs, code, comments, tests, benchmarks)."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NUMBERED_STOP = re.compile(r"\bstops?\s+[0-9]+", re.IGNORECASE)


def _tracked_text_files() -> list[Path]:
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    files = []
    for name in out.decode().split("\0"):
        path = ROOT / name
        if name and path.is_file():
            head = path.read_bytes()[:8192]
            if b"\0" not in head:                   # text, not a binary (.npy, .png, ...)
                files.append(path)
    return files


def test_no_numbered_stop_wording():
    hits = []
    for path in _tracked_text_files():
        text = path.read_text(encoding="utf-8", errors="replace")
        for m in NUMBERED_STOP.finditer(text):             # the whole text: the words may wrap across lines
            n = text.count("\n", 0, m.start()) + 1
            hits.append(f"{path.relative_to(ROOT)}:{n}: {' '.join(m.group().split())}")
    assert not hits, "say when with a date or a commit id:\n" + "\n".join(hits)


def test_the_check_finds_the_wording():
    """The negative control: the pattern catches the forms that were in the project."""
    for text in ("from stop " + "33 on", "Stop " + "36: the prefill graph", "since stop\n" + "34 bench",
                 "stops " + "33-36"):                 # spelt in two pieces, so that this file passes the check
        assert NUMBERED_STOP.search(text), text
    assert not NUMBERED_STOP.search("spinning with the forced stop: 24.5")
