"""The server's settings (`edgespec serve` fills them from its flags, whose defaults it reads from
here), in a module without starlette so that the command line can read them without the [serve] extra."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Settings:
    model: str                        # the name /v1/models lists and requests must name
    api_key: str | None = None
    max_body: int = 1 << 20           # bytes
    max_tokens_cap: int = 1024
    timeout: float = 300.0            # seconds per request, queue wait included
