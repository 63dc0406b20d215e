"""JSON Lines: one record per non-blank line, with a one-line error naming the file and line."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable, Iterator

from edgespec import jsonio
from edgespec.errors import CalibrationError


def jsonl_records(lines: Iterable[str], path: str | Path) -> Iterator[tuple[int, Any]]:
    """(line number, decoded record) for each non-blank line."""
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            yield lineno, jsonio.loads(line)
        except ValueError as exc:
            raise CalibrationError(f"{path}:{lineno}: not valid JSON ({exc})") from None
