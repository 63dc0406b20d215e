"""`edgespec serve` operations on a second real server (smollm-self bundle): the API key, the bounded
queue (429 + Retry-After), --timeout, and SIGTERM (the in-flight stream ends with a final chunk, the
queued request gets a 503, the process exits 0)."""
from __future__ import annotations

import json
import signal
import threading
import time

import httpx
import openai
import pytest

from test_serve import Server, bundle_path

pytestmark = pytest.mark.real

KEY = "sekret-123"
COUNTING = {"model": "smollm", "prompt": "1, 2, 3, 4, 5,", "max_tokens": 1000, "temperature": 0}   # no EOS soon
TIMEOUT_S = 5           # long enough for the queue tests' running stream on a busy 2-core machine


@pytest.fixture(scope="module")
def server(request):
    srv = Server(bundle_path(request), "--max-queue", "1", "--max-tokens-cap", "1000", "--timeout", str(TIMEOUT_S),
                 "--model-name", "smollm", env={"EDGESPEC_API_KEY": KEY})
    yield srv
    srv.stop()


def auth(key=KEY) -> dict:
    return {"Authorization": f"Bearer {key}"}


def events(response):
    """The SSE data objects of a streamed response, up to [DONE] (included as the string)."""
    for line in response.iter_lines():
        if line.startswith("data: "):
            data = line[6:]
            yield data if data == "[DONE]" else json.loads(data)
            if data == "[DONE]":
                return


def wait_for(h: httpx.Client, cond, what: str, limit: float = 20) -> dict:
    t = time.perf_counter()
    while not cond(state := h.get("/health").json()):
        assert time.perf_counter() - t < limit, f"timed out waiting for {what}: {state}"
        time.sleep(0.05)
    return state


def test_api_key(server):
    assert "API key required" in server.startup_line
    with httpx.Client(base_url=server.url) as h:
        assert h.get("/health").status_code == 200                     # no key needed
        r = h.get("/v1/models")
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        assert h.get("/v1/models", headers=auth("wrong")).status_code == 401
        r = h.post("/v1/completions", json={**COUNTING, "max_tokens": 2})
        assert r.status_code == 401
        assert h.get("/v1/models", headers=auth()).json()["data"][0]["id"] == "smollm"
    with pytest.raises(openai.AuthenticationError):
        server.client(api_key="wrong").completions.create(model="smollm", prompt="hi", max_tokens=2)
    got = server.client(api_key=KEY).completions.create(model="smollm", prompt="hi", max_tokens=2, temperature=0)
    assert got.usage.completion_tokens == 2


def test_queue_full_is_429_with_retry_after(server):
    with httpx.Client(base_url=server.url, headers=auth(), timeout=60) as h, \
            httpx.Client(base_url=server.url, headers=auth(), timeout=60) as other:
        with h.stream("POST", "/v1/completions", json={**COUNTING, "stream": True}) as running:
            stream = events(running)            # keep a reference: a collected generator closes the response
            first = next(stream)
            assert first["choices"][0]["text"] is not None
            queued: dict = {}
            t = threading.Thread(target=lambda: queued.update(
                r=other.post("/v1/completions", json={**COUNTING, "max_tokens": 2})))
            t.start()
            wait_for(h, lambda s: s["queued"] == 1, "the second request to queue")
            r = h.post("/v1/completions", json={**COUNTING, "max_tokens": 2})
            assert r.status_code == 429 and r.json()["error"]["code"] == "queue_full"
            assert int(r.headers["retry-after"]) >= 1
        # leaving the block closed the stream: its generation stops, the queued request runs
        t.join(60)
        assert queued["r"].status_code == 200 and queued["r"].json()["usage"]["completion_tokens"] == 2
        assert h.get("/health").json()["served"] >= 3


def test_timeout_ends_a_long_generation(server):
    with httpx.Client(base_url=server.url, headers=auth(), timeout=60) as h:
        t = time.perf_counter()
        got = list(_stream(h))
        took = time.perf_counter() - t
    assert got[-1] == "[DONE]"
    last = got[-2]
    assert last["choices"][0]["finish_reason"] == "length" and last["edgespec"]["stop_reason"] == "timeout"
    assert TIMEOUT_S - 0.5 < took < TIMEOUT_S + 10


def _stream(h: httpx.Client):
    with h.stream("POST", "/v1/completions", json={**COUNTING, "stream": True}) as r:
        yield from events(r)


def test_sigterm_ends_streams_with_a_final_chunk_and_exits_0(server):
    with httpx.Client(base_url=server.url, headers=auth(), timeout=60) as h, \
            httpx.Client(base_url=server.url, headers=auth(), timeout=60) as other:
        stream = _stream(h)
        assert next(stream)["choices"][0]["finish_reason"] is None
        queued: dict = {}
        t = threading.Thread(target=lambda: queued.update(
            r=other.post("/v1/completions", json={**COUNTING, "max_tokens": 2})))
        t.start()
        wait_for(h, lambda s: s["queued"] == 1, "the second request to queue")
        server.proc.send_signal(signal.SIGTERM)
        rest = list(stream)
        t.join(60)
    assert rest[-1] == "[DONE]"
    final = rest[-2]
    assert final["choices"][0]["finish_reason"] == "length" and final["edgespec"]["stop_reason"] == "shutdown"
    assert queued["r"].status_code == 503 and queued["r"].json()["error"]["code"] == "shutting_down"
    assert server.proc.wait(30) == 0
