"""llama.cpp as a row of `edgespec bench --llama-server BIN`: plain decoding of the target's own
GGUF (the recipe the bundle was exported from, sha256-pinned) by a llama-server this bench starts, on
the same prompt token ids, interleaved with edgespec's rows, with the same thread count.

Each generation is one streamed `/completion` request: the prompt as token ids (no template or BOS is
added: the ids are the bench's own), greedy (`top_k` 1, temperature 0), no prompt cache, so every
prompt is prefilled. TTFT is the arrival of the first token's event and the total the arrival of the
last, timed here like edgespec's rows (the HTTP hop costs well under a millisecond a token). The
server's weights are llama.cpp's Q4_K_M, not the bundle's int4 graph, so its greedy tokens may differ
from `ar`'s: the report counts how many match, and makes no lossless claim of it.
"""
from __future__ import annotations

import http.client
import json
import re
import socket
import subprocess
import time
from collections import deque
from pathlib import Path
from threading import Thread

from edgespec.runtime.api.decoder import GenerationResult
from edgespec.runtime.engine.sessions import default_threads
from edgespec.runtime.api.stats import GenerationStats

LLAMA = "llama.cpp"
START_TIMEOUT_S = 180.0
REQUEST_TIMEOUT_S = 600.0


class PeerError(RuntimeError):
    """The llama.cpp row cannot run here (one line: why)."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def target_gguf(bundle) -> Path:
    """The GGUF the bundle's target was exported from: its recipe's pinned file, joined and verified if
    it is not on this machine yet."""
    from edgespec.models import get_model
    from edgespec.models.weights import assemble_gguf, local_gguf
    source = bundle.manifest.get("target", {}).get("source", {})
    if source.get("kind") != "recipe":
        raise PeerError("the bundle's target is not from a model recipe, so there is no GGUF of it to give llama.cpp")
    try:
        recipe = get_model(source["name"])
    except (KeyError, ValueError) as exc:
        raise PeerError(f"no recipe {source.get('name')!r} here ({exc})") from None
    if recipe.sha256 != source.get("sha256"):
        raise PeerError(f"the recipe {recipe.name} pins another file than the bundle was exported from")
    return local_gguf(recipe) or assemble_gguf(recipe, progress=False)


def _version(binary: Path) -> str:
    """llama.cpp's own words for its build ("commit 0c1e570"), "" if it does not say."""
    try:
        out = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise PeerError(f"{binary} does not run here ({exc})") from None
    found = re.search(r"commit ([0-9a-f]+)", out.stdout + out.stderr)
    return f"commit {found.group(1)}" if found else ""


class LlamaServerPeer:
    """A llama-server process on the target's GGUF, answering `generate` like a decoder (greedy only)."""

    def __init__(self, binary: Path, gguf: Path, threads: int | None, context: int = 4096):
        binary = Path(binary)
        if not binary.is_file():
            raise PeerError(f"{binary} is not a file (give the path of llama.cpp's llama-server)")
        self.version = _version(binary)
        n = str(int(threads or default_threads()))
        self.port = _free_port()
        self.command = [str(binary), "-m", str(gguf), "-t", n, "-tb", n, "-c", str(context), "-np", "1",
                        "--host", "127.0.0.1", "--port", str(self.port), "--no-webui", "--no-cache-prompt"]
        self.proc = subprocess.Popen(self.command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, text=True, errors="replace")
        self._log: deque[str] = deque(maxlen=20)
        Thread(target=self._drain, daemon=True).start()
        try:
            self._wait_ready()
        except BaseException:
            self.close()
            raise

    def _drain(self) -> None:
        for line in self.proc.stderr:
            self._log.append(line.rstrip())

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                last = next((line for line in reversed(self._log) if line.strip()), "no output")
                raise PeerError(f"llama-server exited with {self.proc.returncode}: {last[:200]}")
            conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=2)
            try:
                conn.request("GET", "/health")
                if conn.getresponse().status == 200:
                    return
            except OSError:
                pass
            finally:
                conn.close()
            time.sleep(0.2)
        raise PeerError(f"llama-server did not answer /health within {START_TIMEOUT_S:.0f} s")

    def generate(self, ids, max_new_tokens: int, temperature: float = 0.0, **_ignored) -> GenerationResult:
        body = json.dumps({"prompt": [int(i) for i in ids], "n_predict": int(max_new_tokens), "temperature": 0.0,
                           "top_k": 1, "stream": True, "cache_prompt": False, "return_tokens": True})
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=REQUEST_TIMEOUT_S)
        t0 = time.perf_counter()
        conn.request("POST", "/completion", body, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            raise PeerError(f"llama-server answered {resp.status}: {resp.read(200)!r}")
        out: list[int] = []
        ttft, stop_type = None, None
        for raw in resp:
            line = raw.strip()
            if not line.startswith(b"data:"):
                continue
            event = json.loads(line[5:])
            tokens = event.get("tokens") or []
            if tokens and ttft is None:
                ttft = (time.perf_counter() - t0) * 1e3
            out.extend(int(t) for t in tokens)
            if event.get("stop"):
                stop_type = event.get("stop_type", "limit")
                break
        total = (time.perf_counter() - t0) * 1e3
        conn.close()
        if stop_type is None:
            raise PeerError(f"llama-server ended a stream without its last event (exit code {self.proc.poll()})")
        st = GenerationStats(strategy=LLAMA, new_tokens=len(out), prompt_tokens=len(ids), prefill_tokens=1,
                             target_forwards=len(out), verify_forwards=max(len(out) - 1, 0), total_ms=total,
                             ttft_ms=ttft if ttft is not None else total,
                             stop_reason="eos" if stop_type == "eos" else "length",
                             providers={"target": [f"llama.cpp {self.version}".strip()]})
        return GenerationResult(text="", token_ids=out, stats=st, prompt_token_ids=list(ids))

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
