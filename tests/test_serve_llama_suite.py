"""llama.cpp's own server test suite (ggml-org/llama.cpp, tools/server/tests/unit/), ported case by case
to `edgespec serve`: what any OpenAI-compatible server should do, checked with the real `openai` client
and httpx against one module-scoped server on the smollm-self bundle (and a second one started with
`--api-key` and `--cors-origins` for the security cases).

Upstream asserts exact texts of its own tiny model (stories15M); here the same requests are checked by
properties instead: status codes and OpenAI's response shapes; `usage` consistent with the text
(prompt_tokens = the in-process decoder's `encode_prompt(messages, chat=True)` length; completion_tokens
<= max_tokens, and == max_tokens where finish_reason is "length"); streamed text equal to the plain text
at temperature 0; a seed giving the same text twice; stop strings; n_predict/max_tokens; response_format
and llama.cpp's top-level `json_schema` and `grammar` giving valid (schema-valid) output; logprobs shapes;
the Responses API. Every test names the upstream case it ports in a one-line comment (cases the brief
asks for that have no upstream counterpart say "no upstream case").

Not ported (llama-native routes, flags or fields; nothing an OpenAI client sends):
- test_basic: test_server_props (/props), test_server_slots (/slots, --slots), test_load_split_model
  (split GGUF files: a bundle is ONNX), test_no_webui (the built-in web UI, --no-webui),
  test_server_model_aliases_and_tags (--alias lists and --tags: llama-native /models fields).
- test_security: test_access_static_assets_without_api_key for /bundle.js and /bundle.css (web UI
  assets; "/" is ported), test_local_media_file (multimodal, --media-path), and test_cors_options'
  Access-Control-Allow-Credentials case (see "arguable" below).
- test_chat_completion: the jinja / chat_template parametrisations (server flags overriding the
  template; the bundle's own template is used), test_chat_template and
  test_chat_template_assistant_prefill (they read the `__verbose` debug prompt), test_apply_chat_template
  (/apply-template), test_chat_completion_with_timings_per_token (llama's `timings` object),
  test_return_progress (`prompt_progress`), the `exceed_context_size_error` type / n_prompt_tokens / n_ctx
  fields of test_context_size_exceeded (llama's error extension; OpenAI's code context_length_exceeded
  is checked instead).
- test_completion: the /completion route itself (its `content`, `timings`, `truncated`, `has_new_line`,
  `stop_type`, `generation_settings`, `tokens` fields); the cases are ported to /v1/completions where
  the OpenAI route means the same. Not ported at all: test_completion_response_fields (`response_fields`),
  test_n_probs_post_sampling (`post_sampling_probs`), the mixed string-and-ids sequence of
  test_completion_with_tokens_input, the n_slots / n_batch parametrisations (llama-server flags: this
  server has one decoder), the /slots checks of test_completion_parallel_slots and test_cancel_request
  (ported with /health instead), test_consistent_result_different_batch_size (--batch-size), the /tokenize
  calls (the in-process tokenizer gives the ids), test_logit_bias's four logit_bias encodings (llama's
  list form; the OpenAI form is ported as the documented 400).
- test_stream: all of it is llama-server's router (model autoload, /v1/stream resume and DELETE,
  X-Conversation-Id); only "a model name with slashes streams an answer" is ported.
- test_tool_call: the real-model tool calls (test_completion_with_required_tool_real_model, test_weather,
  test_calc_result, test_hello_world) need a template with tools: ported as their request shapes, which
  this bundle (SmolLM2's template never reads `tools`) must refuse with the documented 400;
  test_thoughts (`reasoning_format`, `reasoning_content`: llama-native).
- test_compat_oai_responses: test_responses_stream_with_llama_telemetry (llama's `timings` and
  `prompt_progress` on Responses events).
- test_ctx_shift: test_ctx_shift_enabled (--context-shift: the prompt is truncated to fit; this server
  refuses a prompt over the context instead, as OpenAI does).
- test_tokenize (/tokenize, /detokenize) and test_infill (/infill, FIM): llama-native routes.
- Out of scope, llama-native: embeddings, rerank, lora, metrics, slot save/restore, multimodal, router,
  anthropic, speculative-decoding flags.

Arguable (the server follows OpenAI, upstream follows llama-server):
- test_access_public_endpoint[/models]: llama-server serves /models without the key; OpenAI (and this
  server) require it. Ported as: /health public, /models 401 without the key and 200 with it.
- test_incorrect_api_key: upstream wants error.type "authentication_error"; OpenAI's own 401 is
  type "invalid_request_error", code "invalid_api_key": that is checked.
- test_cors_options[Access-Control-Allow-Credentials]: a Bearer key set by a page's script is a request
  header (allowed by Access-Control-Allow-Headers), not a CORS credential; not asserted.
- test_invalid_chat_completion_req's two-assistant-turns-at-the-end case: llama-server refuses it, OpenAI
  accepts consecutive assistant messages; only "a 400 in OpenAI's shape or a 200 answer, never a 5xx"
  is asserted.
"""
from __future__ import annotations

import concurrent.futures
import json
import os
import time
from pathlib import Path

import httpx
import jsonschema
import openai
import pytest

from edgespec.runtime import Bundle, SpeculativeDecoder
from edgespec.serve.process import ServeProcess

pytestmark = pytest.mark.real

MODEL = "smollm-suite"           # the main server's --model-name
CAP = 32                         # its --max-tokens-cap
KEY = "sk-this-is-the-secret-key"
SECURE_CAP = 8                   # the key server's --max-tokens-cap (upstream's key cases set no max_tokens)
CORS_ORIGIN = "http://localhost:8080"
BOOK = [{"role": "system", "content": "Book"}, {"role": "user", "content": "What is the best book"}]
CODING = [{"role": "system", "content": "You are a coding assistant."}, {"role": "user", "content": "Write an example"}]
MEANING = "I believe the meaning of life is"
LONG_TEXT = ("Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor incididunt ut labore et "
             "dolore magna aliqua. Ut enim ad minim veniam, quis nostrud exercitation ullamco laboris nisi ut aliquip "
             "ex ea commodo consequat. Duis aute irure dolor in reprehenderit in voluptate velit esse cillum dolore eu "
             "fugiat nulla pariatur. Excepteur sint occaecat cupidatat non proident, sunt in culpa qui officia "
             "deserunt mollit anim id est laborum.\n")
TEST_TOOL = {"type": "function", "function": {"name": "test", "description": "", "parameters": {
    "type": "object", "properties": {"success": {"type": "boolean", "const": True}}, "required": ["success"]}}}
PYTHON_TOOL = {"type": "function", "function": {
    "name": "python", "description": "Runs code in an ipython interpreter and returns the result.",
    "parameters": {"type": "object", "properties": {"code": {"type": "string", "description": "The code to run."}},
                   "required": ["code"]}}}
WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_current_weather", "description": "Get the current weather in a given location",
    "parameters": {"type": "object", "properties": {"location": {"type": "string"}}, "required": ["location"]}}}


# ---------------------------------------------------------------------------------- fixtures, helpers
def bundle_path(request) -> Path:
    env = os.environ.get("EDGESPEC_SMOLLM_BUNDLE")
    return Path(env) if env else request.getfixturevalue("smollm_self_bundle")


@pytest.fixture(scope="module")
def bundle(request):
    return bundle_path(request)


@pytest.fixture(scope="module")
def server(bundle):
    srv = ServeProcess(bundle, "--model-name", MODEL, "--max-tokens-cap", str(CAP), "--max-queue", "16")
    yield srv
    assert srv.stop() == 0, "".join(srv.lines)


@pytest.fixture(scope="module")
def secure(bundle):
    srv = ServeProcess(bundle, "--api-key", KEY, "--cors-origins", CORS_ORIGIN, "--max-tokens-cap", str(SECURE_CAP))
    yield srv
    assert srv.stop() == 0, "".join(srv.lines)


@pytest.fixture(scope="module")
def ref(bundle):
    """The in-process decoder: its tokenizer and chat template are what usage.prompt_tokens must count."""
    return SpeculativeDecoder(Bundle.load(bundle, verify="fast"), strategy="ar", draft_length=1, threads=1)


@pytest.fixture(scope="module")
def client(server):
    return server.client(timeout=120)


def post(srv, path: str, body, headers: dict | None = None, timeout: float = 120) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(srv.url + path, content=content, timeout=timeout,
                      headers={"content-type": "application/json", **(headers or {})})


def sse(srv, path: str, body: dict, headers: dict | None = None) -> list[dict]:
    """The JSON payloads of a streamed answer (200 asserted), up to `data: [DONE]` (asserted)."""
    out, done = [], False
    with httpx.stream("POST", srv.url + path, json=body, timeout=120, headers=headers or {}) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                done = True
                continue
            out.append(json.loads(line[len("data: "):]))
    assert done, "the stream did not end with data: [DONE]"
    return out


def check_usage(usage, max_tokens: int, finish_reasons) -> None:
    """completion_tokens <= max_tokens; == max_tokens (per choice) where every choice ended at "length"."""
    reasons = list(finish_reasons)
    get = (lambda k: usage[k]) if isinstance(usage, dict) else (lambda k: getattr(usage, k))
    assert get("total_tokens") == get("prompt_tokens") + get("completion_tokens")
    assert 0 <= get("completion_tokens") <= max_tokens * len(reasons)
    assert set(reasons) <= {"stop", "length"}, reasons
    if all(r == "length" for r in reasons):
        assert get("completion_tokens") == max_tokens * len(reasons)
    if all(r == "stop" for r in reasons):
        assert get("completion_tokens") < max_tokens * len(reasons)


def chat_prompt_tokens(ref, messages) -> int:
    return len(ref.encode_prompt(messages, chat=True))


def is_error(r: httpx.Response, status: int = 400) -> dict:
    assert r.status_code == status, f"{r.status_code} {r.text[:300]}"
    err = r.json()["error"]
    assert err["message"] and err["type"] and "\n" not in err["message"], err
    return err


# ---------------------------------------------------------------------------------- test_basic.py
def test_server_start_simple(server):
    # upstream: test_basic.py::test_server_start_simple
    r = httpx.get(server.url + "/health", timeout=30)
    assert r.status_code == 200 and r.json()["status"] == "ok"


def test_server_start_with_host_family(server):
    # upstream: test_basic.py::test_server_start_with_host_family (ipv4: the default bind is 127.0.0.1)
    port = server.url.rsplit(":", 1)[1]
    for host in ("127.0.0.1", "localhost"):
        r = httpx.get(f"http://127.0.0.1:{port}/health", headers={"host": f"{host}:{port}"}, timeout=30)
        assert r.status_code == 200, (host, r.text)


@pytest.mark.parametrize("path", ["/models", "/v1/models"])
def test_server_models(server, path):
    # upstream: test_basic.py::test_server_models
    r = httpx.get(server.url + path, timeout=30)
    assert r.status_code == 200
    body = r.json()
    assert body["object"] == "list" and len(body["data"]) == 1
    assert body["data"][0]["id"] == MODEL and body["data"][0]["object"] == "model"
    assert [m.id for m in server.client().models.list().data] == [MODEL]


# ---------------------------------------------------------------------------------- test_security.py
@pytest.mark.parametrize("endpoint", ["/health", "/models"])
def test_access_public_endpoint(secure, endpoint):
    # upstream: test_security.py::test_access_public_endpoint (arguable for /models: module docstring)
    r = httpx.get(secure.url + endpoint, timeout=30)
    if endpoint == "/health":
        assert r.status_code == 200 and "error" not in r.json()
    else:
        assert is_error(r, 401)["code"] == "invalid_api_key"
        r = httpx.get(secure.url + endpoint, headers={"authorization": f"Bearer {KEY}"}, timeout=30)
        assert r.status_code == 200 and "error" not in r.json()


def test_access_static_assets_without_api_key(secure):
    # upstream: test_security.py::test_access_static_assets_without_api_key[/] (the web UI's assets: not ported)
    r = httpx.get(secure.url + "/", timeout=30)
    assert r.status_code == 200 and "error" not in r.json()


@pytest.mark.parametrize("api_key", [None, "invalid-key"])
def test_incorrect_api_key(secure, api_key):
    # upstream: test_security.py::test_incorrect_api_key
    headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
    r = post(secure, "/completions", {"prompt": MEANING}, headers)
    err = is_error(r, 401)
    assert err["code"] == "invalid_api_key" and err["type"] == "invalid_request_error"     # OpenAI's 401
    if api_key:                                   # (the openai client refuses to send no key at all)
        with pytest.raises(openai.AuthenticationError):
            secure.client(api_key=api_key).completions.create(model="x", prompt=MEANING, max_tokens=2)


def test_correct_api_key(secure):
    # upstream: test_security.py::test_correct_api_key
    r = post(secure, "/completions", {"prompt": MEANING}, {"authorization": f"Bearer {KEY}"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert "error" not in body and isinstance(body["choices"][0]["text"], str)
    check_usage(body["usage"], SECURE_CAP, [body["choices"][0]["finish_reason"]])   # --max-tokens-cap bounds it


def test_correct_api_key_anthropic_header(secure):
    # upstream: test_security.py::test_correct_api_key_anthropic_header
    r = post(secure, "/completions", {"prompt": MEANING}, {"x-api-key": KEY})
    assert r.status_code == 200, r.text
    assert "error" not in r.json() and isinstance(r.json()["choices"][0]["text"], str)


def test_openai_library_correct_api_key(secure):
    # upstream: test_security.py::test_openai_library_correct_api_key (base URL without /v1)
    c = openai.OpenAI(api_key=KEY, base_url=secure.url, max_retries=0, timeout=120)
    res = c.chat.completions.create(model="gpt-3.5-turbo", messages=[
        {"role": "system", "content": "You are a chatbot."}, {"role": "user", "content": "What is the meaning of life?"}])
    assert len(res.choices) == 1 and res.choices[0].message.role == "assistant"
    check_usage(res.usage, SECURE_CAP, [res.choices[0].finish_reason])


@pytest.mark.parametrize("header,want", [
    ("access-control-allow-origin", CORS_ORIGIN),
    ("access-control-allow-methods", {"GET", "POST"}),
    ("access-control-allow-headers", {"authorization"}),
])
def test_cors_options(secure, header, want):
    # upstream: test_security.py::test_cors_options (origins: the one given by --cors-origins)
    r = httpx.request("OPTIONS", secure.url + "/completions", timeout=30, headers={
        "origin": CORS_ORIGIN, "access-control-request-method": "POST",
        "access-control-request-headers": "Authorization"})
    assert r.status_code == 200, r.text            # a preflight carries no key: it must not need one
    value = r.headers.get(header)
    assert value is not None, dict(r.headers)
    if isinstance(want, set):
        got = {v.strip().lower() for v in value.split(",")}
        assert {w.lower() for w in want} <= got or "*" in got, value
    else:
        assert value == want


def test_cors_refuses_unlisted_origins(secure):
    # upstream: test_security.py::test_cors_options (the other side: an origin not in --cors-origins)
    r = httpx.request("OPTIONS", secure.url + "/completions", timeout=30, headers={
        "origin": "http://web.mydomain.fr", "access-control-request-method": "POST"})
    assert r.status_code == 403 and "access-control-allow-origin" not in r.headers
    r = post(secure, "/completions", {"prompt": MEANING, "max_tokens": 2},
             {"origin": CORS_ORIGIN, "authorization": f"Bearer {KEY}"})
    assert r.status_code == 200 and r.headers.get("access-control-allow-origin") == CORS_ORIGIN


# ---------------------------------------------------------------------------------- test_chat_completion.py
@pytest.mark.parametrize("model,system_prompt,user_prompt,max_tokens", [
    (None, "Book", "Hey", 8),
    (None, "Book", "What is the best book", 8),
    ("codellama70b", "You are a coding assistant.", "Write the fibonacci function in c++.", 16),
    (None, "Book", [{"type": "text", "text": "What is "}, {"type": "text", "text": "the best book"}], 8),
])
def test_chat_completion(server, ref, model, system_prompt, user_prompt, max_tokens):
    # upstream: test_chat_completion.py::test_chat_completion
    messages = [{"role": "system", "content": system_prompt}, {"role": "user", "content": user_prompt}]
    body = {"max_tokens": max_tokens, "messages": messages, **({"model": model} if model else {})}
    r = post(server, "/chat/completions", body)
    assert r.status_code == 200, r.text
    res = r.json()
    assert "cmpl" in res["id"] and res["object"] == "chat.completion" and res["model"] == MODEL
    choice = res["choices"][0]
    assert choice["index"] == 0 and choice["message"]["role"] == "assistant"
    assert isinstance(choice["message"]["content"], str)
    if isinstance(user_prompt, list):           # text parts: the prompt is their text, however joined
        texts = [p["text"] for p in user_prompt]
        want = {chat_prompt_tokens(ref, [messages[0], {"role": "user", "content": sep.join(texts)}]) for sep in ("", "\n")}
    else:
        want = {chat_prompt_tokens(ref, messages)}
    assert res["usage"]["prompt_tokens"] in want
    check_usage(res["usage"], max_tokens, [choice["finish_reason"]])


@pytest.mark.parametrize("messages,max_tokens", [(BOOK, 8), (CODING, 16)])
def test_chat_completion_stream(server, client, ref, messages, max_tokens):
    # upstream: test_chat_completion.py::test_chat_completion_stream
    chunks = sse(server, "/chat/completions", {"max_tokens": max_tokens, "messages": messages, "stream": True,
                                               "temperature": 0, "stream_options": {"include_usage": True}})
    content, ids, reasons = "", {c["id"] for c in chunks}, []
    assert len(ids) == 1 and "cmpl" in ids.pop()           # one id for every chunk of the stream
    with_choices = [c for c in chunks if c["choices"]]
    first = with_choices[0]["choices"][0]
    assert first["delta"]["role"] == "assistant" and not first["delta"].get("content")
    for data in with_choices:
        assert data["object"] == "chat.completion.chunk" and data["model"] == MODEL
        choice = data["choices"][0]
        if data is not with_choices[0]:
            assert "role" not in choice["delta"] or choice["delta"]["role"] is None
        if choice["finish_reason"] is not None:
            assert not choice["delta"].get("content")
            reasons.append(choice["finish_reason"])
        else:
            content += choice["delta"].get("content") or ""
    assert len(reasons) == 1 and with_choices[-1]["choices"][0]["finish_reason"] == reasons[0]
    usage = chunks[-1]["usage"]                              # include_usage: the last chunk, no choices
    assert not chunks[-1]["choices"] and usage["prompt_tokens"] == chat_prompt_tokens(ref, messages)
    check_usage(usage, max_tokens, reasons)
    plain = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=max_tokens, temperature=0)
    assert plain.choices[0].message.content == content and plain.choices[0].finish_reason == reasons[0]
    assert plain.usage.completion_tokens == usage["completion_tokens"]


def test_chat_completion_with_openai_library(server):
    # upstream: test_chat_completion.py::test_chat_completion_with_openai_library
    c = openai.OpenAI(api_key="dummy", base_url=server.url + "/v1", max_retries=0, timeout=120)
    texts = []
    for _ in range(2):                              # the same seed: the same text
        res = c.chat.completions.create(model="gpt-3.5-turbo-instruct", messages=BOOK, max_tokens=8, seed=42,
                                        temperature=0.8)
        assert res.choices[0].message.content is not None
        check_usage(res.usage, 8, [res.choices[0].finish_reason])
        texts.append(res.choices[0].message.content)
    assert texts[0] == texts[1]


@pytest.mark.parametrize("response_format,max_tokens,want", [
    ({"type": "json_object", "schema": {"const": "42"}}, 6, "42"),
    ({"type": "json_object", "schema": {"items": [{"type": "integer"}]}}, 12, None),     # no "type": any value
    ({"type": "json_object", "schema": {"type": "array", "items": {"type": "integer", "minimum": -5000, "maximum": 5000},
                                        "minItems": 1, "maxItems": 1}}, 12, "valid"),   # upstream's intent
    ({"type": "json_schema", "json_schema": {"schema": {"const": "foooooo"}}}, 10, "foooooo"),
    ({"type": "json_object"}, 16, None),
    ({"type": "sound"}, 0, 400),
    ({"type": "json_object", "schema": 123}, 0, 400),
    ({"type": "json_object", "schema": {"type": 123}}, 0, 400),
    ({"type": "json_object", "schema": {"type": "hiccup"}}, 0, 400),
])
def test_completion_with_response_format(server, response_format, max_tokens, want):
    # upstream: test_chat_completion.py::test_completion_with_response_format
    body = {"max_tokens": max_tokens or 8, "messages": CODING, "response_format": response_format, "temperature": 0}
    r = post(server, "/chat/completions", body)
    if want == 400:
        assert is_error(r)["param"].startswith("response_format")
        return
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    content = choice["message"]["content"]
    schema = response_format.get("schema") or (response_format.get("json_schema") or {}).get("schema")
    if want == "valid":                             # small enough to finish: it must
        assert choice["finish_reason"] == "stop", content
        jsonschema.Draft7Validator(schema).validate(json.loads(content))
    elif want is not None:
        assert json.loads(content) == want and choice["finish_reason"] == "stop"
    elif choice["finish_reason"] == "stop":
        value = json.loads(content)
        if schema is None:
            assert isinstance(value, dict)
        else:
            jsonschema.Draft7Validator(schema).validate(value)      # draft 7: upstream's tuple-form items
    else:                                           # cut at max_tokens: still the start of such a value
        assert content.strip()
        if schema is None:
            assert content.lstrip().startswith("{")


def test_completion_with_json_schema_response_format_object(server):
    # upstream: test_chat_completion.py::test_completion_with_response_format (an object schema, OpenAI's form)
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
                                               "age": {"type": "integer", "minimum": 0, "maximum": 120}},
              "required": ["name", "age"], "additionalProperties": False}
    res = server.client().chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Give me a person as JSON."}], max_tokens=40, temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": schema}})
    assert res.choices[0].finish_reason == "stop", res.choices[0].message.content
    jsonschema.validate(json.loads(res.choices[0].message.content), schema)


@pytest.mark.parametrize("json_schema,max_tokens,want", [({"const": "42"}, 6, "42")])
def test_completion_with_json_schema(server, json_schema, max_tokens, want):
    # upstream: test_chat_completion.py::test_completion_with_json_schema (llama's top-level json_schema)
    r = post(server, "/chat/completions", {"max_tokens": max_tokens, "messages": CODING, "json_schema": json_schema})
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert json.loads(choice["message"]["content"]) == want and choice["finish_reason"] == "stop"


@pytest.mark.parametrize("grammar,max_tokens,want", [('root ::= "a"{5,5}', 6, "aaaaa")])
def test_completion_with_grammar(server, grammar, max_tokens, want):
    # upstream: test_chat_completion.py::test_completion_with_grammar (llama's top-level GBNF grammar)
    r = post(server, "/chat/completions", {"max_tokens": max_tokens, "grammar": grammar,
                                           "messages": [{"role": "user", "content": "Does not matter what I say, does it?"}]})
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["message"]["content"] == want and choice["finish_reason"] == "stop"
    r = post(server, "/completions", {"max_tokens": max_tokens, "grammar": grammar, "prompt": MEANING})
    assert r.status_code == 200 and r.json()["choices"][0]["text"] == want, r.text    # on /completions too


@pytest.mark.parametrize("messages", [
    None,
    "string",
    [123],
    [{}],
    [{"role": 123}],
    [{"role": "system", "content": 123}],
    [{"content": "hello"}],                       # upstream's commented-out TODO case: no role
    [{"role": "system", "content": "test"}, {}],
])
def test_invalid_chat_completion_req(server, messages):
    # upstream: test_chat_completion.py::test_invalid_chat_completion_req
    r = post(server, "/chat/completions", {"messages": messages} if messages is not None else {})
    assert is_error(r)["param"].startswith("messages")


def test_invalid_chat_completion_req_two_assistant_turns(server):
    # upstream: test_chat_completion.py::test_invalid_chat_completion_req[user, assistant, assistant] (arguable)
    r = post(server, "/chat/completions", {"max_tokens": 4, "messages": [
        {"role": "user", "content": "test"}, {"role": "assistant", "content": "test"},
        {"role": "assistant", "content": "test"}]})
    assert r.status_code in (200, 400), r.text
    if r.status_code == 400:
        is_error(r)
    else:
        assert r.json()["choices"][0]["message"]["role"] == "assistant"


def test_logprobs(server, client):
    # upstream: test_chat_completion.py::test_logprobs
    res = client.chat.completions.create(model="gpt-3.5-turbo-instruct", temperature=0.0, messages=BOOK, max_tokens=5,
                                         logprobs=True, top_logprobs=10)
    text = res.choices[0].message.content
    lp = res.choices[0].logprobs
    assert lp is not None and lp.content is not None
    assert len(lp.content) == res.usage.completion_tokens
    for token in lp.content:
        assert token.logprob <= 0.0 and token.bytes is not None
        assert len(token.top_logprobs) == 10
        tops = [t.logprob for t in token.top_logprobs]
        assert tops == sorted(tops, reverse=True) and all(t <= 0.0 for t in tops)
        assert token.logprob >= tops[0] - 1e-4          # greedy: the chosen token is the most likely one
    assert "".join(t.token for t in lp.content) == text
    assert b"".join(bytes(t.bytes) for t in lp.content).decode("utf-8") == text


def test_logprobs_stream(server, client):
    # upstream: test_chat_completion.py::test_logprobs_stream
    stream = client.chat.completions.create(model="gpt-3.5-turbo-instruct", temperature=0.0, messages=BOOK,
                                            max_tokens=5, logprobs=True, top_logprobs=10, stream=True)
    output, aggregated = "", ""
    for i, data in enumerate(stream):
        if not data.choices:
            continue
        choice = data.choices[0]
        if i == 0:
            assert choice.delta.role == "assistant" and not choice.delta.content
            continue
        assert choice.delta.role is None
        if choice.finish_reason is None:
            output += choice.delta.content or ""
            assert choice.logprobs is not None and choice.logprobs.content is not None
            for token in choice.logprobs.content:
                aggregated += token.token
                assert token.logprob <= 0.0 and token.bytes is not None
                assert token.top_logprobs is not None and len(token.top_logprobs) == 10
    assert output and aggregated == output
    plain = client.chat.completions.create(model=MODEL, temperature=0.0, messages=BOOK, max_tokens=5, logprobs=True,
                                           top_logprobs=10)
    assert plain.choices[0].message.content == output


def test_logit_bias(server):
    # upstream: test_chat_completion.py::test_logit_bias (the runtime cannot bias logits: the documented 400)
    r = post(server, "/chat/completions", {"messages": BOOK, "max_tokens": 8, "logit_bias": {"1000": -100}})
    err = is_error(r)
    assert err["param"] == "logit_bias" and "logit_bias" in err["message"]


def long_chat(ref, min_tokens: int) -> list[dict]:
    pair = chat_prompt_tokens(ref, BOOK * 2) - chat_prompt_tokens(ref, BOOK)
    return BOOK * (min_tokens // max(pair, 1) + 20)


def test_context_size_exceeded(server, ref):
    # upstream: test_chat_completion.py::test_context_size_exceeded (messages * N: a prompt over the context)
    ctx = ref.bundle.target.max_position
    messages = long_chat(ref, ctx)
    assert chat_prompt_tokens(ref, messages) > ctx
    err = is_error(post(server, "/chat/completions", {"messages": messages}))
    assert err["code"] == "context_length_exceeded" and str(ctx) in err["message"]
    assert httpx.get(server.url + "/health", timeout=30).json()["status"] == "ok"


def test_context_size_exceeded_stream(server, client, ref):
    # upstream: test_chat_completion.py::test_context_size_exceeded_stream (a 400 status, not an SSE error)
    messages = long_chat(ref, ref.bundle.target.max_position)
    with pytest.raises(openai.BadRequestError) as e:
        for _ in client.chat.completions.create(model=MODEL, messages=messages, stream=True):
            pass
    assert e.value.status_code == 400 and e.value.code == "context_length_exceeded"


def test_chat_completions_multiple_choices(server, ref):
    # upstream: test_chat_completion.py::test_chat_completions_multiple_choices
    r = post(server, "/chat/completions", {"max_tokens": 8, "n": 2, "messages": BOOK})
    assert r.status_code == 200, r.text
    res = r.json()
    assert [c["index"] for c in res["choices"]] == [0, 1]
    for choice in res["choices"]:
        assert choice["message"]["role"] == "assistant" and isinstance(choice["message"]["content"], str)
    assert res["usage"]["prompt_tokens"] == chat_prompt_tokens(ref, BOOK)      # the prompt counted once
    check_usage(res["usage"], 8, [c["finish_reason"] for c in res["choices"]])


# ---------------------------------------------------------------------------------- test_completion.py
@pytest.mark.parametrize("prompt,n_predict,return_tokens", [
    (MEANING, 8, False),
    ("Write a joke about AI from a very long prompt which will not be truncated", 256, True),   # over the cap
])
def test_completion(server, ref, prompt, n_predict, return_tokens):
    # upstream: test_completion.py::test_completion (/completion's n_predict on /v1/completions)
    r = post(server, "/v1/completions", {"n_predict": n_predict, "prompt": prompt, "return_tokens": return_tokens})
    assert r.status_code == 200, r.text
    res = r.json()
    assert res["object"] == "text_completion" and "cmpl" in res["id"]
    assert isinstance(res["choices"][0]["text"], str) and res["choices"][0]["text"]
    assert res["usage"]["prompt_tokens"] == len(ref.encode_prompt(prompt))
    check_usage(res["usage"], min(n_predict, CAP), [res["choices"][0]["finish_reason"]])
    if return_tokens:            # accepted and reported, not a 400 (serve/llama_fields.py)
        assert "return_tokens" in res["edgespec"].get("not_applied", {})


@pytest.mark.parametrize("prompt,n_predict", [(MEANING, 8), ("Write a joke about AI", 256)])
def test_completion_stream(server, ref, prompt, n_predict):
    # upstream: test_completion.py::test_completion_stream
    chunks = sse(server, "/v1/completions", {"n_predict": n_predict, "prompt": prompt, "stream": True,
                                             "stream_options": {"include_usage": True}})
    text, reasons = "", []
    for data in chunks[:-1]:
        assert data["object"] == "text_completion" and len(data["choices"]) == 1
        choice = data["choices"][0]
        text += choice["text"]
        if choice["finish_reason"] is not None:
            reasons.append(choice["finish_reason"])
    assert len(reasons) == 1 and chunks[-2]["choices"][0]["finish_reason"] == reasons[0] and text
    assert chunks[-1]["usage"]["prompt_tokens"] == len(ref.encode_prompt(prompt))
    check_usage(chunks[-1]["usage"], min(n_predict, CAP), reasons)


def test_completion_stream_vs_non_stream(server):
    # upstream: test_completion.py::test_completion_stream_vs_non_stream
    body = {"n_predict": 8, "prompt": MEANING, "temperature": 0}
    stream = "".join(c["choices"][0]["text"] for c in sse(server, "/v1/completions", dict(body, stream=True))
                     if c["choices"])
    plain = post(server, "/v1/completions", body).json()["choices"][0]["text"]
    assert stream == plain and plain


def test_completion_with_openai_library(server):
    # upstream: test_completion.py::test_completion_with_openai_library
    c = openai.OpenAI(api_key="dummy", base_url=server.url + "/v1", max_retries=0, timeout=120)
    res = c.completions.create(model="davinci-002", prompt=MEANING, max_tokens=8)
    assert res.choices[0].text is not None and res.model == MODEL
    check_usage(res.usage, 8, [res.choices[0].finish_reason])


def test_completion_stream_with_openai_library(client):
    # upstream: test_completion.py::test_completion_stream_with_openai_library
    output, reasons = "", []
    for data in client.completions.create(model="davinci-002", prompt=MEANING, max_tokens=8, stream=True):
        choice = data.choices[0]
        if choice.finish_reason is None:
            assert choice.text is not None
            output += choice.text
        else:
            reasons.append(choice.finish_reason)
    assert output and len(reasons) == 1 and reasons[0] in ("stop", "length")


@pytest.mark.parametrize("stream", [False, True])
def test_completion_stream_with_openai_library_stops(client, stream):
    # upstream: test_completion.py::test_completion_stream_with_openai_library_stops (a stop string seen greedily)
    prompt = "System: You are a helpful assistant.\nAssistant:\nHey! How could I help?\nUser:\nTell me a joke.\nAssistant:\n"
    free = client.completions.create(model=MODEL, prompt=prompt, max_tokens=16, temperature=0).choices[0].text
    words = [w for w in free.split(" ") if len(w) >= 3]
    assert len(free) > 6 and words, free
    stop = words[min(1, len(words) - 1)]          # a piece of the free answer, past its start
    want = free[:free.index(stop)]

    def ask(stops):
        if not stream:
            res = client.completions.create(model=MODEL, prompt=prompt, max_tokens=16, temperature=0, stop=stops)
            return res.choices[0].text, res.choices[0].finish_reason
        text, reason = "", None
        for data in client.completions.create(model=MODEL, prompt=prompt, max_tokens=16, temperature=0, stop=stops,
                                              stream=True):
            text += data.choices[0].text or ""
            reason = data.choices[0].finish_reason or reason
        return text, reason

    assert ask([stop]) == (want, "stop")
    assert ask(["User:\n", "Assistant:\n", stop]) == (want, "stop")     # upstream's list, plus the one seen


def test_consistent_result_same_seed(server):
    # upstream: test_completion.py::test_consistent_result_same_seed (at temperature 1: the seed pins it)
    texts = [post(server, "/v1/completions", {"prompt": MEANING, "seed": 42, "temperature": 1.0, "max_tokens": 12,
                                              "cache_prompt": False}).json()["choices"][0]["text"] for _ in range(3)]
    assert texts[0] and texts == [texts[0]] * 3


def test_different_result_different_seed(server):
    # upstream: test_completion.py::test_different_result_different_seed
    texts = [post(server, "/v1/completions", {"prompt": MEANING, "seed": seed, "temperature": 1.0, "max_tokens": 12,
                                              "cache_prompt": False}).json()["choices"][0]["text"] for seed in range(4)]
    assert all(a != b for a, b in zip(texts, texts[1:])), texts


def test_cache_vs_nocache_prompt(server):
    # upstream: test_completion.py::test_cache_vs_nocache_prompt (skipped upstream; honoured here)
    body = {"prompt": MEANING, "seed": 42, "temperature": 1.0, "max_tokens": 12}
    cached = post(server, "/v1/completions", dict(body, cache_prompt=True)).json()
    uncached = post(server, "/v1/completions", dict(body, cache_prompt=False)).json()
    assert cached["choices"][0]["text"] == uncached["choices"][0]["text"]
    assert "cache_prompt" not in cached["edgespec"].get("not_applied", {})
    assert "cache_prompt" in uncached["edgespec"].get("not_applied", {})      # reported, never silently dropped


def test_nocache_long_input_prompt(server, ref):
    # upstream: test_completion.py::test_nocache_long_input_prompt (a prompt over the context: 400)
    prompt = MEANING * (ref.bundle.target.max_position // len(ref.encode_prompt(MEANING)) + 50)
    r = post(server, "/v1/completions", {"prompt": prompt, "seed": 42, "temperature": 1.0, "cache_prompt": False})
    assert is_error(r)["code"] == "context_length_exceeded"


def test_completion_with_tokens_input(server, ref):
    # upstream: test_completion.py::test_completion_with_tokens_input (single prompt of ids)
    tokens = ref.encode_prompt(MEANING)
    by_ids = post(server, "/v1/completions", {"prompt": tokens, "max_tokens": 8, "temperature": 0})
    assert by_ids.status_code == 200, by_ids.text
    by_text = post(server, "/v1/completions", {"prompt": MEANING, "max_tokens": 8, "temperature": 0}).json()
    assert by_ids.json()["choices"][0]["text"] == by_text["choices"][0]["text"]
    assert by_ids.json()["usage"]["prompt_tokens"] == len(tokens)


@pytest.mark.parametrize("kind", ["ids", "mixed"])
def test_completion_with_tokens_input_batch(server, ref, kind):
    # upstream: test_completion.py::test_completion_with_tokens_input (batch and mixed batch: OpenAI's prompt arrays)
    tokens = ref.encode_prompt(MEANING)
    prompt = [tokens, tokens] if kind == "ids" else [tokens, MEANING]
    r = post(server, "/v1/completions", {"prompt": prompt, "max_tokens": 6, "temperature": 0})
    assert r.status_code == 200, r.text
    choices = r.json()["choices"]
    assert [c["index"] for c in choices] == [0, 1] and choices[0]["text"] == choices[1]["text"]


def test_completion_parallel_slots(server):
    # upstream: test_completion.py::test_completion_parallel_slots (concurrent requests, one decoder: all answered)
    prompts = ["Write a very long book.", "Write another a poem.", "What is LLM?", "The sky is blue and I love it."]
    with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
        results = list(pool.map(lambda p: post(server, "/v1/completions", {
            "prompt": p, "seed": 42, "temperature": 1.0, "max_tokens": 8}), prompts))
    for r in results:
        assert r.status_code == 200, r.text
        assert isinstance(r.json()["choices"][0]["text"], str) and r.json()["choices"][0]["text"]


def test_n_probs(server, client):
    # upstream: test_completion.py::test_n_probs (n_probs is /completion's; OpenAI's form: logprobs = 5)
    res = client.completions.create(model=MODEL, prompt=MEANING, logprobs=5, temperature=0.0, max_tokens=5)
    lp, text = res.choices[0].logprobs, res.choices[0].text
    assert lp is not None and len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset)
    assert len(lp.tokens) == res.usage.completion_tokens
    check_usage(res.usage, 5, [res.choices[0].finish_reason])
    assert "".join(lp.tokens) == text
    for i, (tok, logprob, top) in enumerate(zip(lp.tokens, lp.token_logprobs, lp.top_logprobs)):
        assert isinstance(tok, str) and logprob <= 0.0
        assert 1 <= len(top) <= 5 and all(v <= 0.0 for v in top.values())
        assert tok in top and abs(top[tok] - logprob) < 1e-4 and logprob >= max(top.values()) - 1e-4   # greedy
        if i:
            assert lp.text_offset[i] - lp.text_offset[i - 1] == len(lp.tokens[i - 1])


def test_n_probs_stream(server, client):
    # upstream: test_completion.py::test_n_probs_stream
    text, seen = "", 0
    for data in client.completions.create(model=MODEL, prompt=MEANING, logprobs=5, temperature=0.0, max_tokens=5,
                                          stream=True):
        choice = data.choices[0]
        text += choice.text
        if choice.text:
            lp = choice.logprobs
            assert lp is not None and "".join(lp.tokens) == choice.text
            for logprob, top in zip(lp.token_logprobs, lp.top_logprobs):
                assert logprob <= 0.0 and 1 <= len(top) <= 5
            seen += len(lp.tokens)
    assert text and seen >= 1


def test_logit_bias_completion(server):
    # upstream: test_completion.py::test_logit_bias (OpenAI's map form; the runtime cannot bias: the documented 400)
    r = post(server, "/v1/completions", {"prompt": "What is the best book", "max_tokens": 8, "temperature": 0,
                                         "logit_bias": {"1000": -100}})
    assert is_error(r)["param"] == "logit_bias"


def test_cancel_request(server):
    # upstream: test_completion.py::test_cancel_request (a client that times out stops its generation)
    with pytest.raises(httpx.ReadTimeout):
        post(server, "/v1/completions", {"prompt": MEANING, "max_tokens": CAP, "temperature": 0}, timeout=0.25)
    t = time.perf_counter()
    while (state := httpx.get(server.url + "/health", timeout=30).json())["busy"]:
        assert time.perf_counter() - t < 5, "the generation ran on after its client left"
        time.sleep(0.05)
    assert state["last"]["stop_reason"] == "disconnect", state["last"]
    assert state["last"]["completion_tokens"] < CAP


# ---------------------------------------------------------------------------------- test_ctx_shift.py
@pytest.mark.parametrize("n_predict,n_token_output", [(16, 16), (-1, CAP)])
def test_ctx_shift_disabled_short_prompt(server, n_predict, n_token_output):
    # upstream: test_ctx_shift.py::test_ctx_shift_disabled_short_prompt (-1: as many as the server allows)
    r = post(server, "/v1/completions", {"n_predict": n_predict, "prompt": "Hi how are you", "temperature": 0})
    assert r.status_code == 200, r.text
    res = r.json()
    check_usage(res["usage"], n_token_output, [res["choices"][0]["finish_reason"]])


def test_ctx_shift_disabled_long_prompt(server, ref):
    # upstream: test_ctx_shift.py::test_ctx_shift_disabled_long_prompt
    prompt = LONG_TEXT * (ref.bundle.target.max_position // len(ref.encode_prompt(LONG_TEXT)) + 2)
    r = post(server, "/v1/completions", {"n_predict": 64, "prompt": prompt})
    err = is_error(r)
    assert err["code"] == "context_length_exceeded" and "context" in err["message"]


def test_ctx_shift_disabled_stream(server):
    # upstream: test_ctx_shift.py::test_ctx_shift_disabled_stream (256 > the server's cap: ends at "length")
    content, reasons = "", []
    for data in sse(server, "/v1/completions", {"n_predict": 256, "prompt": "Once", "stream": True}):
        choice = data["choices"][0]
        if choice["finish_reason"] is None:
            content += choice["text"]
        else:
            reasons.append(choice["finish_reason"])
            assert choice["finish_reason"] == "stop" or len(content) > 0
    assert len(reasons) == 1 and reasons[0] in ("stop", "length")


# ---------------------------------------------------------------------------------- test_stream.py
def test_stream_with_slashed_model_name(server):
    # upstream: test_stream.py::test_stream_resume_and_stop_with_slashed_model_name (only its first request)
    chunks = sse(server, "/v1/chat/completions", {"model": "ggml-org/tinygemma3-GGUF:Q8_0", "stream": True,
                                                  "max_tokens": 16, "messages": [{"role": "user", "content": "hello"}]})
    content = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert len(content) > 0 and all(c["model"] == MODEL for c in chunks)


# ---------------------------------------------------------------------------------- test_tool_call.py
@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("tool", [TEST_TOOL, PYTHON_TOOL])
def test_completion_with_required_tool_tiny(server, tool, stream):
    # upstream: test_tool_call.py::do_test_completion_with_required_tool_tiny (no tools in this template: 400)
    r = post(server, "/v1/chat/completions", {"max_tokens": 16, "messages": CODING, "tool_choice": "required",
                                              "tools": [tool], "parallel_tool_calls": False, "stream": stream,
                                              "temperature": 0.0, "top_k": 1, "top_p": 1.0})
    err = is_error(r)
    assert err["param"] == "tools" and "tool" in err["message"]


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("tools,tool_choice", [([], None), ([TEST_TOOL], None), ([PYTHON_TOOL], "none")])
def test_completion_without_tool_call_fast(server, tools, tool_choice, stream):
    # upstream: test_tool_call.py::test_completion_without_tool_call_fast
    body = {"max_tokens": 8, "messages": [{"role": "system", "content": "You are a coding assistant."},
                                          {"role": "user", "content": "say hello world with python"}],
            "tools": tools or None, "tool_choice": tool_choice, "stream": stream}
    if tools:                                     # this template never reads tools: the documented 400
        assert is_error(post(server, "/v1/chat/completions", body))["param"] == "tools"
        return
    if stream:
        chunks = sse(server, "/v1/chat/completions", body)
        assert all("tool_calls" not in (c["choices"][0]["delta"] if c["choices"] else {}) for c in chunks)
    else:
        r = post(server, "/v1/chat/completions", body)
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["message"].get("tool_calls") is None


@pytest.mark.parametrize("case", ["weather", "hello_world", "calc_result"])
def test_tool_call_real_model_requests(server, case):
    # upstream: test_tool_call.py::test_weather / test_hello_world / test_calc_result (their request shapes)
    if case == "weather":
        body = {"messages": [{"role": "system", "content": "You are a chatbot that uses tools/functions."},
                             {"role": "user", "content": "What is the weather in Istanbul?"}], "tools": [WEATHER_TOOL]}
    elif case == "hello_world":
        body = {"messages": [{"role": "system", "content": "You are a tool-calling agent."},
                             {"role": "user", "content": "say hello world with python"}], "tools": [PYTHON_TOOL]}
    else:
        calc = {"type": "function", "function": {"name": "calculate", "description": "A calculator", "parameters": {
            "type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}}}
        body = {"messages": [
            {"role": "system", "content": "You are a tools-calling assistant."},
            {"role": "user", "content": "What's the y coordinate of a point on the unit sphere at angle 30 degrees?"},
            {"role": "assistant", "content": None, "tool_calls": [{"id": "call_6789", "type": "function", "function": {
                "name": "calculate", "arguments": "{\"expression\":\"sin(30 * pi / 180)\"}"}}]},
            {"role": "tool", "name": "calculate", "content": "0.55644242476", "tool_call_id": "call_6789"}],
            "tools": [calc]}
    assert is_error(post(server, "/v1/chat/completions", dict(body, max_tokens=8)))["param"] == "tools"


def test_malformed_tool_call_args_rejected(server):
    # upstream: test_tool_call.py::test_malformed_tool_call_args_rejected
    r = post(server, "/v1/chat/completions", {"max_tokens": 8, "messages": [
        {"role": "user", "content": "Hello"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_123", "type": "function", "function": {"name": "test", "arguments": "{"}}]},
        {"role": "user", "content": "Continue"}]})
    err = is_error(r)
    assert err["type"] == "invalid_request_error" and err["param"].startswith("messages[1]")


# ---------------------------------------------------------------------------------- test_compat_oai_responses.py
@pytest.mark.parametrize("text_format,max_output_tokens,want", [
    ({"type": "json_schema", "name": "test", "schema": {"const": "foooooo"}}, 10, "foooooo"),
    ({"type": "json_object"}, 16, "{"),
    ({"type": "text"}, 10, None),
    ({"type": "json_schema", "name": "test"}, 8, 400),          # no schema
])
def test_responses_with_text_format(server, text_format, max_output_tokens, want):
    # upstream: test_compat_oai_responses.py::test_responses_with_text_format
    r = post(server, "/responses", {"input": "Write an example", "max_output_tokens": max_output_tokens,
                                    "text": {"format": text_format}, "temperature": 0})
    if want == 400:
        assert is_error(r)["param"].startswith("text.format")
        return
    assert r.status_code == 200, r.text
    res = r.json()
    assert res["object"] == "response" and res["id"].startswith("resp_")
    message = next(o for o in res["output"] if o["type"] == "message")
    text = message["content"][0]["text"]
    assert message["content"][0]["type"] == "output_text" and isinstance(text, str)
    assert res["usage"]["output_tokens"] <= max_output_tokens
    if want == "{":
        assert text.lstrip().startswith("{")
        if res["status"] == "completed":
            assert isinstance(json.loads(text), dict)
    elif want is not None:
        assert json.loads(text) == want and res["status"] == "completed"


def test_responses_with_openai_library(server, ref):
    # upstream: test_compat_oai_responses.py::test_responses_with_openai_library
    c = openai.OpenAI(api_key="dummy", base_url=server.url + "/v1", max_retries=0, timeout=120)
    res = c.responses.create(model="gpt-4.1", input=BOOK, max_output_tokens=8, temperature=0.8)
    assert res.id.startswith("resp_") and res.object == "response"
    assert res.output[0].id is not None and res.output[0].id.startswith("msg_")
    assert isinstance(res.output_text, str)
    assert res.usage.input_tokens == chat_prompt_tokens(ref, BOOK)
    assert res.usage.output_tokens <= 8
    assert res.usage.total_tokens == res.usage.input_tokens + res.usage.output_tokens
    if res.status == "incomplete":
        assert res.incomplete_details.reason == "max_output_tokens" and res.usage.output_tokens == 8
    else:
        assert res.status == "completed" and res.usage.output_tokens < 8


def test_responses_stream_with_openai_library(server, client):
    # upstream: test_compat_oai_responses.py::test_responses_stream_with_openai_library
    stream = client.responses.create(model="gpt-4.1", input=BOOK, max_output_tokens=8, temperature=0.0, stream=True)
    gathered, resp_id, msg_id, types, completed = "", "", "", [], None
    for r in stream:
        types.append(r.type)
        if r.type == "response.created":
            assert r.response.id.startswith("resp_")
            resp_id = r.response.id
        if r.type == "response.in_progress":
            assert r.response.id == resp_id
        if r.type == "response.output_item.added":
            assert r.item.id is not None and r.item.id.startswith("msg_")
            msg_id = r.item.id
        if r.type in ("response.content_part.added", "response.output_text.delta", "response.output_text.done",
                      "response.content_part.done"):
            assert r.item_id == msg_id
        if r.type == "response.output_item.done":
            assert r.item.id == msg_id
        if r.type == "response.output_text.delta":
            gathered += r.delta
        if r.type in ("response.completed", "response.incomplete"):
            completed = r.response
    assert types[0] == "response.created" and completed is not None and completed.id == resp_id
    assert completed.output[0].id.startswith("msg_") and gathered == completed.output_text
    plain = client.responses.create(model="gpt-4.1", input=BOOK, max_output_tokens=8, temperature=0.0)
    assert plain.output_text == gathered          # streamed = plain at temperature 0


def test_responses_stream_helper(client):
    # no upstream case: client.responses.stream (the openai helper) accumulates the same text as its deltas
    for max_output_tokens in (6, 64):             # cut (response.incomplete) and, likely, finished
        deltas, final = [], None
        with client.responses.stream(model=MODEL, input="Say hello.", max_output_tokens=max_output_tokens,
                                     temperature=0) as stream:
            for event in stream:
                if event.type == "response.output_text.delta":
                    deltas.append(event.delta)
                if event.type in ("response.completed", "response.incomplete"):
                    final = event.response
            if final.status == "completed":       # the helper's final response: response.completed only
                assert stream.get_final_response().output_text == final.output_text
        assert deltas and "".join(deltas) == final.output_text
        assert final.usage.output_tokens <= max_output_tokens
        if final.status == "incomplete":
            assert final.incomplete_details.reason == "max_output_tokens"
            assert final.usage.output_tokens == max_output_tokens


def test_responses_input_string_and_instructions(client, ref):
    # no upstream case: input as a string, and instructions as the first system message
    res = client.responses.create(model=MODEL, input="What is the best book", max_output_tokens=6, temperature=0)
    assert res.usage.input_tokens == chat_prompt_tokens(ref, [{"role": "user", "content": "What is the best book"}])
    res = client.responses.create(model=MODEL, input="What is the best book", instructions="Book",
                                  max_output_tokens=6, temperature=0)
    assert res.usage.input_tokens == chat_prompt_tokens(ref, BOOK) and res.instructions == "Book"


def test_responses_previous_response_id(client, ref):
    # no upstream case: previous_response_id carries the conversation (not its instructions), unknown ids 404
    first = client.responses.create(model=MODEL, input="My name is Ada.", instructions="Be brief.",
                                    max_output_tokens=6, temperature=0)
    second = client.responses.create(model=MODEL, input="What is my name?", previous_response_id=first.id,
                                     max_output_tokens=6, temperature=0)
    history = [{"role": "user", "content": "My name is Ada."}, {"role": "assistant", "content": first.output_text},
               {"role": "user", "content": "What is my name?"}]
    assert second.previous_response_id == first.id
    assert second.usage.input_tokens == chat_prompt_tokens(ref, history)
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model=MODEL, input="Hi", previous_response_id="resp_" + "0" * 32, max_output_tokens=4)
