"""The server's settings (`edgespec serve` fills them from its flags, whose defaults it reads from
here), in a module without starlette so that the command line can read them without the [serve] extra."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Settings:
    model: str                        # the name /v1/models lists and every response carries
    api_key: str | None = None
    max_body: int = 1 << 20           # bytes
    max_tokens_cap: int = 1024
    timeout: float = 300.0            # seconds per request, queue wait included
    strict_model: bool = False        # refuse requests that name another model (404) or none (400)
    host: str = "127.0.0.1"           # the bind address (serve/guard.py: which Host headers are local)
    allowed_hosts: tuple[str, ...] = ()     # more Host names ("*": any; ".example.com": a domain)
    cors_origins: tuple[str, ...] = ()      # web origins allowed to call the server ("*": any)
    header_timeout: float = 10.0      # seconds a connection may take to send a request's headers
    body_timeout: float = 30.0        # seconds a request may take to send its body
    max_connections: int | None = None      # open connections (None: below the descriptor limit, connections.py)
    max_n: int = 8                    # choices one request may ask for (n: repeated generations)
