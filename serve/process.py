"""`edgespec serve` in a child process, for an app (an editor plugin, an agent) that starts its own local
engine, and for the tests and benchmarks that drive it with a real client: the port is chosen by the
server (`--port 0`) and read from its one startup line.
"""
from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import threading
from pathlib import Path

from edgespec.errors import EdgespecError


class ServeProcess:
    """`python -m edgespec serve --bundle B --port 0 ARGS...`, started and waited for; `url` once ready."""

    def __init__(self, bundle: str | Path, *args: str, env: dict | None = None, startup_s: float = 180,
                 max_open_files: int | None = None):
        """`max_open_files`: the child's descriptor limit (RLIMIT_NOFILE), as a small machine's would be."""
        cmd = [sys.executable, "-m", "edgespec", "serve", "--bundle", str(bundle), "--port", "0", *args]
        self.args = args

        def limit():
            resource.setrlimit(resource.RLIMIT_NOFILE, (max_open_files, max_open_files))

        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                     env=dict(os.environ, **(env or {})),
                                     preexec_fn=limit if max_open_files else None)
        self.lines: list[str] = []
        ready = threading.Event()

        def drain():
            for line in self.proc.stderr:
                self.lines.append(line)
                if "http://" in line:
                    ready.set()
            ready.set()

        threading.Thread(target=drain, daemon=True).start()
        ready.wait(startup_s)
        line = next((x for x in self.lines if "http://" in x), None)
        if line is None or self.proc.poll() is not None:
            self.stop()
            last = next((x.strip() for x in reversed(self.lines) if x.strip()), "no output")
            raise EdgespecError(f"edgespec serve did not start: {last}")
        self.url = "http://" + line.rsplit("http://", 1)[1].split()[0]
        self.startup_line = line

    def client(self, **kw):
        """An `openai.OpenAI` client on this server (no retries: a failure is seen as it happens)."""
        import openai  # lazy: the openai client is the caller's, not a dependency of the server

        return openai.OpenAI(base_url=self.url + "/v1", api_key=kw.pop("api_key", "none"),
                             max_retries=kw.pop("max_retries", 0), **kw)

    def stop(self, wait_s: float = 30) -> int:
        """SIGTERM (the server drains and exits), SIGKILL after `wait_s`; the exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(wait_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode
