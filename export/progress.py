"""The exporters' progress lines (on stderr, prefixed "edgespec:"; nothing when progress is off)."""
from __future__ import annotations

import sys


def log(progress: bool, msg: str) -> None:
    if progress:
        print(f"edgespec: {msg}", file=sys.stderr, flush=True)
