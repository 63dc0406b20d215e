"""`edgespec serve` against the real openai client: one server (a real subprocess on a free port, the
real smollm-self bundle) shared by the module. Greedy answers must equal the in-process decoder's
token for token (same text, same token count), under concurrent load too; bad requests get a 4xx in
OpenAI's error shape and the server keeps serving; a client killed mid-stream stops its generation.

`start_server` is also used by tests/test_serve_ops.py (auth, queue limit, timeout, SIGTERM)."""
from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest

from edgespec.errors import GenerationError
from edgespec.runtime import Bundle, SpeculativeDecoder
from edgespec.serve.process import ServeProcess

pytestmark = pytest.mark.real

CAP = 48                  # the server's --max-tokens-cap
PROMPTS = ["The capital of France is", "def fibonacci(n):\n", "Here is a list of five fruits:\n1.",
           "SELECT name, age FROM users WHERE"]
CHAT = [{"role": "user", "content": "What is the capital of France?"}]


def bundle_path(request) -> Path:
    env = os.environ.get("EDGESPEC_SMOLLM_BUNDLE")
    return Path(env) if env else request.getfixturevalue("smollm_self_bundle")


Server = ServeProcess         # the real server in a child process (edgespec.serve.process)


@pytest.fixture(scope="module")
def bundle(request):
    return bundle_path(request)


@pytest.fixture(scope="module")
def server(bundle):
    srv = Server(bundle, "--max-queue", "32", "--max-tokens-cap", str(CAP), "--max-body", "100000", "--threads", "1",
                 "--model-name", "smollm")
    yield srv
    assert srv.stop() == 0, "".join(srv.lines)


@pytest.fixture(scope="module")
def ref(bundle):
    """The in-process decoder (ar: greedy speculation is lossless, so every strategy gives these tokens)."""
    return SpeculativeDecoder(Bundle.load(bundle, verify="fast"), strategy="ar", draft_length=1, threads=1)


def test_startup_line_and_models(server):
    line = server.startup_line
    assert "smollm" in line and "EP CPU" in line and "strategy auto" in line and server.url in line
    assert [m.id for m in server.client().models.list().data] == ["smollm"]


def test_completion_plain_and_streamed_equal_the_decoder(server, ref):
    client = server.client()
    for prompt in PROMPTS[:2]:
        want = ref.generate(prompt, max_new_tokens=16)
        got = client.completions.create(model="smollm", prompt=prompt, max_tokens=16, temperature=0)
        assert got.choices[0].text == want.text
        assert got.usage.completion_tokens == len(want.token_ids)
        assert got.usage.prompt_tokens == len(want.prompt_token_ids)
        assert got.choices[0].finish_reason == ("length" if want.stats.stop_reason == "length" else "stop")
        ext = got.model_extra["edgespec"]
        assert {"strategy", "draft_length", "acceptance", "tau", "decode_tokens_per_s"} <= set(ext)
        chunks = list(client.completions.create(model="smollm", prompt=prompt, max_tokens=16, temperature=0,
                                                stream=True, stream_options={"include_usage": True}))
        assert "".join(c.choices[0].text for c in chunks if c.choices) == want.text
        assert chunks[-1].usage.completion_tokens == len(want.token_ids) and not chunks[-1].choices
        assert chunks[-2].choices[0].finish_reason == got.choices[0].finish_reason
    want = ref.generate(PROMPTS[2], max_new_tokens=16, stop=["\n"])      # a stop string ends it early
    got = client.completions.create(model="smollm", prompt=PROMPTS[2], max_tokens=16, temperature=0, stop="\n")
    assert got.choices[0].text == want.text and got.usage.completion_tokens == len(want.token_ids)
    assert got.choices[0].finish_reason == "stop" and len(want.token_ids) < 16


def test_chat_plain_and_streamed_equal_the_decoder(server, ref):
    client = server.client()
    want = ref.generate(CHAT, max_new_tokens=20, chat=True)
    got = client.chat.completions.create(model="smollm", messages=CHAT, max_completion_tokens=20, temperature=0)
    assert got.choices[0].message.content == want.text and got.choices[0].message.role == "assistant"
    assert got.usage.completion_tokens == len(want.token_ids)
    assert got.usage.prompt_tokens == len(want.prompt_token_ids)
    stream = client.chat.completions.create(model="smollm", messages=CHAT, max_tokens=20, temperature=0, stream=True)
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == want.text
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")
    assert chunks[-1].model_extra["edgespec"]["strategy"]


def test_load_16_streaming_4_plain_clients(server, ref):
    n_tokens = 4
    want = {p: ref.generate(p, max_new_tokens=n_tokens).text for p in PROMPTS}
    client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=300)

    started = asyncio.Event()          # a stream has its first chunk: generations are under way

    async def streamed(prompt):
        text, ext = "", None
        async for c in await client.completions.create(model="smollm", prompt=prompt, max_tokens=n_tokens,
                                                       temperature=0, stream=True):
            started.set()
            text += c.choices[0].text
            ext = (c.model_extra or {}).get("edgespec", ext)
        return prompt, text, ext

    async def plain(prompt):
        r = await client.completions.create(model="smollm", prompt=prompt, max_tokens=n_tokens, temperature=0)
        return prompt, r.choices[0].text, r.model_extra["edgespec"]

    async def health_while_busy():
        await started.wait()          # not a fixed sleep: on a fast machine all 20 were done within 1 s
        async with httpx.AsyncClient() as h:
            t = time.perf_counter()
            r = await h.get(server.url + "/health")
            return r.json(), time.perf_counter() - t

    async def main():
        jobs = [streamed(PROMPTS[i % 4]) for i in range(16)] + [plain(PROMPTS[i]) for i in range(4)]
        return await asyncio.gather(health_while_busy(), *jobs)

    (health, health_s), *results = asyncio.run(main())
    assert health["busy"] and health_s < 1.0           # /health answers while a generation runs
    assert len(results) == 20
    for prompt, text, _ in results:
        assert text == want[prompt]
    longest = max(ext["total_ms"] for *_, ext in results)
    for *_, ext in results:
        assert ext["queue_position"] < 32
        # FIFO: a request waits at most for the ones ahead of it
        assert ext["queue_ms"] <= ext["queue_position"] * (longest + 250) + 1000


def test_client_killed_mid_stream_then_a_correct_answer(server, ref):
    script = ("import openai, sys\n"
              f"c = openai.OpenAI(base_url={server.url + '/v1'!r}, api_key='none', max_retries=0)\n"
              "for ch in c.completions.create(model='smollm', prompt='1, 2, 3, 4, 5,', max_tokens=1000, "
              "temperature=0, stream=True):\n"
              "    print('chunk', flush=True)\n")
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline() == "chunk\n"
    proc.kill()
    killed = time.perf_counter()
    proc.wait()
    with httpx.Client() as h:
        while (state := h.get(server.url + "/health").json())["busy"]:
            assert time.perf_counter() - killed < 5, "generation still running after its client was killed"
            time.sleep(0.05)
    assert state["last"]["stop_reason"] == "disconnect" and state["last"]["completion_tokens"] < CAP
    want = ref.generate("1, 2, 3, 4, 5,", max_new_tokens=CAP)
    got = server.client().completions.create(model="smollm", prompt="1, 2, 3, 4, 5,", max_tokens=1000, temperature=0)
    assert got.choices[0].text == want.text                # the same prompt again: starts clean
    assert got.usage.completion_tokens == len(want.token_ids) <= CAP    # --max-tokens-cap bounds it


BAD = [
    ("chat", b'{"model": "smollm", "messages": [', None),                                   # malformed JSON
    ("chat", b'[1, 2]', None),
    ("chat", {"model": 5, "messages": CHAT}, "model"),
    ("chat", {"model": "smollm", "messages": "hi"}, "messages"),
    ("chat", {"model": "smollm", "messages": []}, "messages"),
    ("chat", {"model": "smollm", "messages": [{"role": "wizard", "content": "hi"}]}, "messages[0].role"),
    ("chat", {"model": "smollm", "messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
    ("chat", {"model": "smollm", "messages": CHAT, "max_tokens": "10"}, "max_tokens"),
    ("chat", {"model": "smollm", "messages": CHAT, "max_tokens": 0}, "max_tokens"),
    ("chat", {"model": "smollm", "messages": CHAT, "max_completion_tokens": -3}, "max_completion_tokens"),
    ("chat", {"model": "smollm", "messages": CHAT, "temperature": "hot"}, "temperature"),
    ("chat", {"model": "smollm", "messages": CHAT, "temperature": 3}, "temperature"),
    ("chat", {"model": "smollm", "messages": CHAT, "top_p": [1]}, "top_p"),
    ("chat", {"model": "smollm", "messages": CHAT, "seed": 1.5}, "seed"),
    ("chat", {"model": "smollm", "messages": CHAT, "stop": 5}, "stop"),
    ("chat", {"model": "smollm", "messages": CHAT, "stop": ["a", 1]}, "stop"),
    ("chat", {"model": "smollm", "messages": CHAT, "stream": "yes"}, "stream"),
    ("chat", {"model": "smollm", "messages": CHAT, "stream_options": {"include_usage": True}}, "stream_options"),
    ("chat", {"model": "smollm", "messages": CHAT, "n": 99}, "n"),                       # over --max-n
    ("chat", {"model": "smollm", "messages": CHAT, "logprobs": "yes"}, "logprobs"),
    ("chat", {"model": "smollm", "messages": CHAT, "top_logprobs": 3}, "top_logprobs"),
    ("chat", {"model": "smollm", "messages": CHAT, "grammar": "root ::= ("}, "grammar"),
    ("chat", {"model": "smollm", "messages": CHAT, "response_format": {"type": "json_schema", "json_schema": {
        "name": "loop", "schema": {"$ref": "#"}}}}, "response_format"),           # admits no output: not an empty 200
    ("chat", {"model": "smollm", "messages": CHAT, "response_format": {"type": "json_object", "schema": {
        "type": "objectx"}}}, "response_format"),                                  # llama-server's form, invalid
    ("chat", b'{"messages": [{"role": "user", "content": "a\\ud800b"}]}', None),  # a lone surrogate escaped in JSON
    ("chat", {"messages": [{"role": "user", "content": "x" * 10}], "max_tokens": [[[[1]]]]}, "max_tokens"),
    ("chat", {"messages": CHAT, "tools": "x" * 50000}, "tools"),
    ("chat", {"model": "smollm", "messages": CHAT, "tools": [{"type": "function", "function": {"name": "f"}}]},
     "tools"),
    ("chat", {"model": "smollm", "messages": CHAT, "response_format": {"type": "xml"}}, "response_format.type"),
    ("chat", {"model": "smollm", "messages": CHAT, "frobnicate": 1}, "frobnicate"),
    ("completion", {"model": "smollm", "prompt": 7}, "prompt"),
    ("completion", {"model": "smollm", "prompt": ""}, "prompt"),
    ("completion", {"model": "smollm", "prompt": ["a", ""]}, "prompt"),
    ("completion", {"model": "smollm", "prompt": "hello " * 9000, "max_tokens": 8}, "prompt"),   # over context
    ("completion", {"model": "smollm", "prompt": "x" * 120000}, None),                           # over --max-body
    ("completion", {"model": "smollm", "prompt": "hi", "logprobs": 99}, "logprobs"),
    ("completion", {"model": "smollm", "prompt": "hi", "echo": True}, "echo"),
    ("completion", {"model": "smollm", "prompt": "hi", "min_p": 2}, "min_p"),
    ("chat", b"[" * 40000 + b"]" * 40000, None),                        # nested past the parser's depth
    ("completion", {"model": "smollm", "prompt": "hi \udcff"}, "prompt"),  # a lone surrogate: not text
]


def test_bad_requests_get_openai_errors_and_the_server_keeps_serving(server):
    route = {"chat": "/v1/chat/completions", "completion": "/v1/completions"}
    with httpx.Client(base_url=server.url, timeout=60) as h:
        for kind, body, param in BAD:
            content = body if isinstance(body, bytes) else json.dumps(body).encode()
            r = h.post(route[kind], content=content, headers={"content-type": "application/json"})
            where = f"{kind} {content[:80]!r}"
            assert 400 <= r.status_code < 500, f"{where}: {r.status_code} {r.text[:200]}"
            err = r.json()["error"]
            assert err["message"] and "\n" not in err["message"] and err["type"], where
            if param is not None:
                assert err["param"] == param and param.split("[")[0] in err["message"], f"{where}: {err}"
        assert h.post("/v1/completions", content=json.dumps({"model": "smollm", "prompt": "x" * 120000}).encode(),
                      headers={"content-type": "application/json"}).status_code == 413
        assert h.get("/v1/nothing").json()["error"]["code"] == "not_found"
        assert h.get("/health").json()["status"] == "ok"
    for content_type in ("text/plain", "application/x-www-form-urlencoded"):    # what a web page can send
        r = h_post(server, "/v1/chat/completions", {"messages": CHAT}, {"content-type": content_type})
        assert r.status_code == 415 and r.json()["error"]["code"] == "unsupported_media_type"
    r = h_post(server, "/v1/chat/completions", {"messages": CHAT}, {"host": "attacker.example:8000"})
    assert r.status_code == 403 and r.json()["error"]["code"] == "host_not_allowed"     # DNS rebinding
    r = h_post(server, "/v1/chat/completions", {"messages": CHAT}, {"origin": "https://attacker.example"})
    assert r.status_code == 403 and r.json()["error"]["code"] == "origin_not_allowed"
    with pytest.raises(openai.BadRequestError, match="'n'"):      # the client sees the error as OpenAI's
        server.client().chat.completions.create(model="smollm", messages=CHAT, n=99)
    got = server.client().completions.create(model="smollm", prompt=PROMPTS[0], max_tokens=3, temperature=0)
    assert got.usage.completion_tokens == 3 and got.choices[0].text


def h_post(server, path, body, headers):
    with httpx.Client(base_url=server.url, timeout=60) as h:
        return h.post(path, content=json.dumps(body).encode(), headers={"content-type": "application/json", **headers})


def test_library_stop_of_the_wrong_type_is_an_edgespec_error(ref):
    for stop in (5, 1.5, {"a": 1}, iter(["a"])):
        with pytest.raises(GenerationError, match="stop must be"):
            ref.generate("hello", max_new_tokens=2, stop=stop)
    assert ref.generate("hello", max_new_tokens=2, stop=("zzz",)).token_ids


def test_a_server_that_cannot_start_says_why_in_one_line(tmp_path):
    """ServeProcess (what apps, tests and benchmarks start): a bundle that is not there is one line naming
    the server's own error, not a hang or a traceback."""
    from edgespec.errors import EdgespecError
    with pytest.raises(EdgespecError) as e:
        ServeProcess(tmp_path / "no-bundle", startup_s=120)
    assert str(e.value).startswith("edgespec serve did not start: ") and "\n" not in str(e.value)
    assert "no-bundle" in str(e.value), str(e.value)


def test_a_seed_pins_the_sampled_text_whatever_the_server_served_before(server, bundle):
    """Five requests with the same seed and body give the same text, with greedy and other seeded requests
    between them (the server's plan, answer store and drafts move on), and it is `ar`'s text with that seed
    in this process (coupled sampling: docs/runtime.md, "Seeded sampling")."""
    client = server.client()
    ar = SpeculativeDecoder(Bundle.load(bundle), strategy="ar", threads=1)
    for prompt, kw in ((PROMPTS[1], dict(temperature=0.8)), (PROMPTS[2], dict(temperature=1.0, top_p=0.9))):
        want = ar.generate(prompt, max_new_tokens=32, seed=7, **kw)
        texts = []
        for i in range(5):
            got = client.completions.create(model="smollm", prompt=prompt, max_tokens=32, seed=7, **kw)
            texts.append(got.choices[0].text)
            client.completions.create(model="smollm", prompt=PROMPTS[i % len(PROMPTS)], max_tokens=8,
                                      temperature=0.9, seed=100 + i)           # other history between them
        assert texts == [want.text] * 5, (prompt, texts, want.text)
    chat = [client.chat.completions.create(model="smollm", messages=CHAT, max_tokens=24, temperature=0.8, seed=3,
                                           extra_body={"min_p": 0.05}).choices[0].message.content for _ in range(5)]
    assert chat == [ar.generate(CHAT, max_new_tokens=24, temperature=0.8, seed=3, min_p=0.05, chat=True).text] * 5


def test_logprobs_are_ars_plain_and_streamed_in_openais_shapes(server, bundle):
    """The server's logprobs are the in-process ar decoder's (to 1e-5), chat and completions, streamed too;
    n choices are n generations (seeds seed, seed + 1)."""
    import argparse
    from edgespec.serve.cli import register
    from edgespec.serve.server import make_decoder
    sub = argparse.ArgumentParser().add_subparsers()
    register(sub)
    args = sub.choices["serve"].parse_args(["--bundle", str(bundle), "--strategy", "ar", "--threads", "1"])
    ref = make_decoder(Bundle.load(bundle, verify="fast"), args, defer_drafter=False)   # ar as the server runs it
    want = ref.generate(CHAT, chat=True, max_new_tokens=12, logprobs=3)
    shown = want.logprobs[:-1] if want.token_ids[-1] in ref.bundle.target.eos_ids else want.logprobs
    client = server.client()
    got = client.chat.completions.create(model="smollm", messages=CHAT, max_tokens=12, temperature=0, logprobs=True,
                                         top_logprobs=3)
    content = got.choices[0].logprobs.content
    assert len(content) == len(shown)
    for entry, e in zip(content, shown):
        # to 1e-5, relative in the tail: the server's KV may hold this prompt from an earlier request, and a
        # forward after a reused prefix rounds differently in float32 than a whole prefill
        assert abs(entry.logprob - e.logprob) < 1e-5 and len(entry.top_logprobs) == 3
        assert all(abs(t.logprob - lp) < 1e-5 * max(1.0, abs(lp)) for t, (_, lp) in zip(entry.top_logprobs, e.top))
        assert bytes(entry.bytes) == ref.bundle.target.tokenizer.decode([e.token_id]).encode() or entry.bytes
    assert "".join(bytes(c.bytes).decode("utf-8", "replace") for c in content) == got.choices[0].message.content
    streamed = [c for chunk in client.chat.completions.create(
        model="smollm", messages=CHAT, max_tokens=12, temperature=0, logprobs=True, top_logprobs=3, stream=True)
        for ch in chunk.choices if ch.logprobs and ch.logprobs.content for c in ch.logprobs.content]
    assert [c.token for c in streamed] == [c.token for c in content]
    assert max(abs(a.logprob - b.logprob) for a, b in zip(streamed, content)) < 1e-5
    comp = client.completions.create(model="smollm", prompt=PROMPTS[0], max_tokens=6, temperature=0, logprobs=2)
    want = ref.generate(PROMPTS[0], max_new_tokens=6, logprobs=2)
    lp = comp.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 6
    assert max(abs(a - e.logprob) for a, e in zip(lp.token_logprobs, want.logprobs)) < 1e-5
    assert lp.text_offset == sorted(lp.text_offset) and all(len(t) == 2 for t in lp.top_logprobs)
    two = client.chat.completions.create(model="smollm", messages=CHAT, max_tokens=8, temperature=0.9, seed=4, n=2)
    one = [client.chat.completions.create(model="smollm", messages=CHAT, max_tokens=8, temperature=0.9, seed=s)
           for s in (4, 5)]
    assert [c.message.content for c in two.choices] == [o.choices[0].message.content for o in one]
    assert [c.index for c in two.choices] == [0, 1]
    assert two.usage.completion_tokens == sum(o.usage.completion_tokens for o in one)
