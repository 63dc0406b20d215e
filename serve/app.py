"""The ASGI app (starlette): OpenAI routes over one `Worker`, behind serve/guard.py's checks.

Routes, each also without the `/v1` prefix (clients given a base URL without it): GET /health (no key
needed; answers while a generation runs), GET /v1/models, POST /v1/chat/completions, POST
/v1/completions and POST /v1/responses (serve/responses.py), plain and streamed (SSE). Every error is
OpenAI's shape. A request is read, checked and tokenised here (`Api.prepare`, shared by the routes),
then queued; a streamed response starts once its generation does, so queue and start errors are still
plain HTTP statuses. `n` choices are n generations one after another (seeds seed, seed + 1, ...).
"""
from __future__ import annotations

import asyncio
import hashlib
import hmac
import sys
import time
from dataclasses import dataclass, replace

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from edgespec import jsonio
from edgespec.errors import EdgespecError
from edgespec.serve import answers, protocol, tools
from edgespec.serve.answers import ClientGone, error_response
from edgespec.serve.errors import APIError
from edgespec.serve.guard import RequestGuard
from edgespec.serve.responses import ResponseMemory
from edgespec.serve.responses_route import respond
from edgespec.serve.settings import Settings
from edgespec.serve.worker import Job, Worker

CLIENT_GONE = 499           # nginx's status for a client that left before its answer (never sent)


@dataclass
class Prepared:
    """A checked request: the parsed fields, and per prompt (a completions batch has several) its ids and
    its generation's settings. Choice i is prompt i // n's generation i % n (OpenAI's order)."""
    req: protocol.Request
    prompts: list[tuple[list[int], dict]]
    scope: str | None

    @property
    def choices(self) -> int:
        return len(self.prompts) * self.req.n


class Api:
    """The routes' shared request handling: key, body, parsing, tokenising, budget, jobs."""

    def __init__(self, worker: Worker, settings: Settings, notices=None):
        self.worker, self.settings, self.dec = worker, settings, worker.dec
        self.context = self.dec.bundle.target.max_position
        self.notices = notices
        self.memory = ResponseMemory()      # finished responses, for previous_response_id (serve/responses.py)

    # ------------------------------------------------------------------ reading a request
    def api_key(self, request: Request) -> str | None:
        auth = request.headers.get("authorization")
        if auth is not None:
            scheme, _, token = auth.partition(" ")
            return token.strip() if scheme.lower() == "bearer" else None
        return request.headers.get("x-api-key")

    def authorize(self, request: Request) -> None:
        if self.settings.api_key is None:
            return
        key = self.api_key(request)
        if key is None or not hmac.compare_digest(key.encode(), self.settings.api_key.encode()):
            sent = "authorization" in request.headers or "x-api-key" in request.headers
            raise APIError(401, "Incorrect API key provided" if sent else
                           "You didn't provide an API key: send it as 'Authorization: Bearer KEY' or 'X-Api-Key: KEY'",
                           code="invalid_api_key")

    def draft_scope(self, request: Request) -> str | None:
        """The answer store's partition (runtime/samplers/answer_store.py): the API key's hash, so that one key's
        answers never draft for another's; None (one shared store) on a server without keys."""
        if self.settings.api_key is None:
            return None
        return "key:" + hashlib.sha256((self.api_key(request) or "").encode()).hexdigest()

    async def read_json(self, request: Request):
        limit = self.settings.max_body
        size = request.headers.get("content-length")
        if size is not None and size.isdigit() and int(size) > limit:
            raise APIError(413, f"the request body ({size} bytes) is over the server's limit of {limit} bytes",
                           code="request_too_large")
        chunks, total = [], 0
        try:
            async with asyncio.timeout(self.settings.body_timeout):
                async for chunk in request.stream():
                    total += len(chunk)
                    if total > limit:
                        raise APIError(413, f"the request body is over the server's limit of {limit} bytes",
                                       code="request_too_large")
                    chunks.append(chunk)
        except TimeoutError:
            raise APIError(408, f"the request body did not arrive within {self.settings.body_timeout:g} s",
                           code="request_timeout") from None
        except ClientDisconnect:
            raise ClientGone() from None
        return answers.decode_body(b"".join(chunks))

    def encode(self, req: protocol.Request) -> tuple[list[int], dict | None]:
        """The prompt's ids and the generation's constraint (structured output, tools: serve/tools.py)."""
        dec = self.dec
        if req.kind == "chat":
            if not dec.bundle.chat_template:
                raise APIError(400, f"the bundle behind '{self.settings.model}' has no chat template: use "
                                    "/v1/completions", param="messages")
            ids = tools.encode_chat(dec, req.prompt, req.tools, parse_special=req.parse_special)
        else:
            ids = dec.encode_prompt(req.prompt)
        return ids, tools.constraint(dec, req)

    def budget(self, req: protocol.Request, n_prompt: int) -> int:
        cap, room = self.settings.max_tokens_cap, (self.context - n_prompt) if self.context else None
        n = min(req.max_tokens, cap) if req.max_tokens is not None else (cap if room is None else min(cap, room))
        if room is not None and (room < 1 or n > room):
            asked = min(req.max_tokens if req.max_tokens is not None else 1, cap)
            raise APIError(400, f"This model's maximum context length is {self.context} tokens. However, you "
                                f"requested {n_prompt + asked} tokens ({n_prompt} in the prompt, {asked} for the "
                                "completion)", param="messages" if req.kind == "chat" else "prompt",
                           code="context_length_exceeded")
        return n

    async def prepare(self, request: Request, parse) -> Prepared:
        """Key, body, `parse(body)` -> protocol.Request, ids, settings: everything before a job."""
        self.authorize(request)
        body = await self.read_json(request)
        req = parse(body)
        batch = req.batch or [req.prompt]
        if req.n * len(batch) > self.settings.max_n:
            raise APIError(400, f"'n' = {req.n} for {len(batch)} prompt(s) is over this server's limit of "
                                f"{self.settings.max_n} choices", param="n")
        prompts = []
        for one in batch:
            try:
                ids, constraint = await run_in_threadpool(self.encode, replace(req, prompt=one))
            except EdgespecError as exc:
                raise APIError(400, str(exc), param="messages" if req.kind == "chat" else "prompt") from None
            prompts.append((ids, dict(max_new_tokens=self.budget(req, len(ids)), temperature=req.temperature,
                                      top_p=req.top_p, top_k=req.top_k, min_p=req.min_p, seed=req.seed,
                                      stop=req.stop or None, **(constraint or {}),
                                      **({"logprobs": req.logprobs} if req.logprobs is not None else {}))))
        return Prepared(req, prompts, self.draft_scope(request))

    # ------------------------------------------------------------------ running jobs
    def job(self, p: Prepared, index: int = 0) -> Job:
        """Choice `index`'s job (its seed: the request's + index % n), submitted (429/503 raise here)."""
        req = p.req
        ids, settings = p.prompts[index // req.n]
        seed = settings["seed"]
        settings = dict(settings, draft_scope=p.scope, seed=None if seed is None else seed + index % req.n)
        calling = answers.calling(req)
        job = Job(ids, settings, time.monotonic() + self.settings.timeout, asyncio.get_running_loop(),
                  deltas=req.stream, guard=answers.guard(req),
                  text_fallback={"grammar": tools.TEXT_ONLY} if calling and req.tool_choice == "auto" else None)
        self.worker.submit(job)
        return job

    async def next_event(self, job: Job, gone: asyncio.Future):
        """The job's next event, or None if the client went away first (the job is then cancelled)."""
        get = asyncio.ensure_future(job.events.get())
        done, _ = await asyncio.wait({get, gone}, return_when=asyncio.FIRST_COMPLETED)
        if get in done:
            return get.result()
        get.cancel()
        self.worker.drop(job, "disconnect")
        return None

    async def started(self, request: Request, job: Job, to_end: bool):
        """The job's "start" event (or, with `to_end`, its last: "done"), an "error" event, or None if the
        client left."""
        gone = asyncio.ensure_future(_until_disconnect(request))
        try:
            event = await self.next_event(job, gone)
            if to_end and event is not None and event[0] == "start":
                event = await self.next_event(job, gone)
            return event
        except asyncio.CancelledError:
            self.worker.drop(job, "disconnect")
            raise
        finally:
            gone.cancel()             # a stream's disconnects are watched by StreamingResponse

    async def run(self, request: Request, p: Prepared) -> list | APIError | None:
        """All `n` choices of a plain request, one after another: their Outcomes, the first error, or None
        when the client left."""
        outs = []
        for i in range(p.choices):
            job = self.job(p, i)
            event = await self.started(request, job, to_end=True)
            if event is None:
                return None
            if event[0] == "error":
                return event[1]
            outs.append(event[1])
        return outs

    def gone(self, what: str = "clients left before their answer") -> Response:
        if self.notices is not None:
            self.notices.note(what)
        return Response(status_code=CLIENT_GONE)


async def _until_disconnect(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


def build_app(worker: Worker, settings: Settings, notices=None) -> RequestGuard:
    """The app with its routes, behind the Host/Origin/Content-Type guard (serve/guard.py)."""
    api = Api(worker, settings, notices)
    model = settings.model

    def parser(kind: str):
        parse = protocol.parse_chat if kind == "chat" else protocol.parse_completion
        return lambda body: parse(body, model, settings.strict_model)

    async def complete(request: Request, kind: str):
        try:
            p = await api.prepare(request, parser(kind))
            if p.req.stream:
                first = api.job(p)
                event = await api.started(request, first, to_end=False)
                if event is None:
                    return api.gone()
                if event[0] == "error":
                    return error_response(event[1])
                return StreamingResponse(answers.sse(api, p, first, model), media_type="text/event-stream",
                                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
            outs = await api.run(request, p)
        except APIError as err:
            return error_response(err)
        except ClientGone:
            return api.gone("clients left while sending their body")
        if outs is None:
            return api.gone()
        if isinstance(outs, APIError):
            return error_response(outs)
        return JSONResponse(answers.full_body(api, p, outs, model))

    async def chat(request: Request):
        return await complete(request, "chat")

    async def completions(request: Request):
        return await complete(request, "completion")

    async def responses(request: Request):
        return await respond(api, request)

    async def health(request: Request):
        return JSONResponse({"status": "shutting_down" if worker.closing else "ok", "model": model,
                             "busy": worker.busy, "queued": worker.queued, "served": worker.served,
                             "last": worker.last})

    async def models(request: Request):
        try:
            api.authorize(request)
        except APIError as err:
            return error_response(err)
        return JSONResponse({"object": "list", "data": [{"id": model, "object": "model",
                                                         "created": int(api.dec.bundle.path.stat().st_mtime),
                                                         "owned_by": "edgespec"}]})

    async def root(request: Request):
        return JSONResponse({"object": "edgespec", "model": model, "api": "/v1 (OpenAI-compatible)"})

    async def http_error(request: Request, exc: HTTPException):
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
        return error_response(APIError(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}",
                                       code=code))

    async def internal_error(request: Request, exc: Exception):
        print(f"edgespec serve: internal error on {request.url.path}: {type(exc).__name__}: "
              f"{' '.join(str(exc).split())[:200]}", file=sys.stderr, flush=True)
        return error_response(APIError(500, f"internal error: {type(exc).__name__}"))

    routes = [Route("/health", health, methods=["GET"]), Route("/v1/health", health, methods=["GET"]),
              Route("/", root, methods=["GET"])]
    for path, handler, methods in (("/models", models, ["GET"]), ("/chat/completions", chat, ["POST"]),
                                   ("/completions", completions, ["POST"]), ("/responses", responses, ["POST"])):
        routes += [Route("/v1" + path, handler, methods=methods), Route(path, handler, methods=methods)]
    app = Starlette(routes=routes, exception_handlers={HTTPException: http_error, Exception: internal_error})
    return RequestGuard(app, settings.host, settings.allowed_hosts, settings.cors_origins)
