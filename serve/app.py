"""The ASGI app (starlette): OpenAI routes over one `Worker`.

GET /health (no key needed; answers while a generation runs), GET /v1/models, POST /v1/chat/completions,
POST /v1/completions, plain and streamed (SSE, ending in `data: [DONE]`). Every error is OpenAI's
shape. A request is checked and tokenised here, then queued; a streamed response starts once its
generation does, so queue and start errors are still plain HTTP statuses.
"""
from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import time

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from edgespec import jsonio
from edgespec.errors import EdgespecError
from edgespec.serve import protocol, tools
from edgespec.serve.protocol import APIError
from edgespec.serve.settings import Settings
from edgespec.serve.worker import Job, Outcome, Worker


def error_response(err: APIError) -> JSONResponse:
    return JSONResponse(err.body(), status_code=err.status, headers=err.headers)


def build_app(worker: Worker, settings: Settings) -> Starlette:
    dec = worker.dec
    context = dec.bundle.target.max_position

    def authorize(request: Request) -> None:
        if settings.api_key is None:
            return
        auth = request.headers.get("authorization", "")
        scheme, _, token = auth.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), settings.api_key.encode()):
            raise APIError(401, "Incorrect API key provided" if auth else
                           "You didn't provide an API key: send it as 'Authorization: Bearer KEY'",
                           code="invalid_api_key")

    def draft_scope(request: Request) -> str | None:
        """The answer store's partition (runtime/samplers/answer_store.py): the API key's hash, so that one key's
        answers never draft for another's; None (one shared store) on a server without keys."""
        token = request.headers.get("authorization", "").partition(" ")[2].strip()
        return "key:" + hashlib.sha256(token.encode()).hexdigest() if settings.api_key is not None else None

    async def read_json(request: Request):
        size = request.headers.get("content-length")
        if size is not None and size.isdigit() and int(size) > settings.max_body:
            raise APIError(413, f"the request body ({size} bytes) is over the server's limit of {settings.max_body} "
                                "bytes", code="request_too_large")
        chunks, total = [], 0
        async for chunk in request.stream():
            total += len(chunk)
            if total > settings.max_body:
                raise APIError(413, f"the request body is over the server's limit of {settings.max_body} bytes",
                               code="request_too_large")
            chunks.append(chunk)
        try:
            return jsonio.loads(b"".join(chunks))
        except (ValueError, UnicodeDecodeError) as exc:
            raise APIError(400, f"the request body is not valid JSON ({exc})", code="invalid_json") from None

    def encode(req: protocol.Request) -> tuple[list[int], dict | None]:
        """The prompt's ids and the generation's constraint (structured output, tools: serve/tools.py)."""
        if req.kind == "chat":
            if not dec.bundle.chat_template:
                raise APIError(400, f"the bundle behind '{settings.model}' has no chat template: use /v1/completions",
                               param="messages")
            ids = tools.encode_chat(dec, req.prompt, req.tools) if req.tools else dec.encode_prompt(req.prompt, chat=True)
            return ids, tools.constraint(dec, req)
        return dec.encode_prompt(req.prompt), None

    def budget(req: protocol.Request, n_prompt: int) -> int:
        room = (context - n_prompt) if context else None
        if req.max_tokens is None:
            n = settings.max_tokens_cap if room is None else min(settings.max_tokens_cap, room)
        else:
            n = min(req.max_tokens, settings.max_tokens_cap)
        if room is not None and (room < 1 or n > room):
            asked = req.max_tokens if req.max_tokens is not None else 1
            raise APIError(400, f"This model's maximum context length is {context} tokens. However, you requested "
                                f"{n_prompt + min(asked, settings.max_tokens_cap)} tokens ({n_prompt} in the prompt, "
                                f"{min(asked, settings.max_tokens_cap)} for the completion)",
                           param="messages" if req.kind == "chat" else "prompt", code="context_length_exceeded")
        return n

    async def until_disconnect(request: Request) -> None:
        while True:
            message = await request.receive()
            if message["type"] == "http.disconnect":
                return

    async def next_event(job: Job, gone: asyncio.Future):
        """The job's next event, or None if the client went away first (the job is then cancelled)."""
        get = asyncio.ensure_future(job.events.get())
        done, _ = await asyncio.wait({get, gone}, return_when=asyncio.FIRST_COMPLETED)
        if get in done:
            return get.result()
        get.cancel()
        worker.drop(job, "disconnect")
        return None

    async def complete(request: Request, kind: str):
        try:
            authorize(request)
            body = await read_json(request)
            req = (protocol.parse_chat if kind == "chat" else protocol.parse_completion)(body, settings.model)
            try:
                ids, constraint = await run_in_threadpool(encode, req)
            except EdgespecError as exc:
                raise APIError(400, str(exc), param="messages" if kind == "chat" else "prompt") from None
            n = budget(req, len(ids))
            job = Job(ids, dict(max_new_tokens=n, temperature=req.temperature, top_p=req.top_p, top_k=req.top_k,
                                min_p=req.min_p, seed=req.seed, stop=req.stop or None, draft_scope=draft_scope(request),
                                **(constraint or {})),
                      time.monotonic() + settings.timeout, asyncio.get_running_loop(), deltas=req.stream,
                      guard=guard(req), text_fallback={"grammar": tools.TEXT_ONLY} if calling(req) and
                      req.tool_choice == "auto" else None)
            worker.submit(job)
        except APIError as err:
            return error_response(err)
        gone = asyncio.ensure_future(until_disconnect(request))     # one watcher while we wait
        try:
            event = await next_event(job, gone)      # "start" or "error" (or None: the client left)
            if event is not None and event[0] == "start" and not req.stream:
                event = await next_event(job, gone)  # "done" or "error"
        except asyncio.CancelledError:
            worker.drop(job, "disconnect")
            raise
        finally:
            gone.cancel()                            # a stream's disconnects are watched by StreamingResponse
        if event is None:
            return JSONResponse({}, status_code=499)
        if event[0] == "error":
            return error_response(event[1])
        rid = protocol.new_id(kind)
        if req.stream:
            return StreamingResponse(sse(job, req, rid), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        out: Outcome = event[1]
        body = protocol.full_body(req, rid, settings.model, out.text, protocol.finish_reason(out.stop_reason),
                                  protocol.usage(out.prompt_tokens, out.completion_tokens), out.ext)
        if calling(req):               # complete calls only (calls.CallGuard); cut by max_tokens: "length"
            choice = body["choices"][0]
            content, calls = tools.parse_tool_calls(out.text)
            loose = loose_calls(req)
            if not calls and loose is not None and (call := loose(out.text)) is not None:
                content, calls = None, [call]
            if calls:
                choice["message"].update(content=content, tool_calls=calls)
                if choice["finish_reason"] == "stop":
                    choice["finish_reason"] = "tool_calls"
        return JSONResponse(body)

    def guard(req: protocol.Request):
        """The tool-call guard of a request (serve/calls.py); under "auto" it knows the calls made."""
        if not calling(req):
            return None
        return tools.CallGuard(req.parallel_tool_calls, tools.made_calls(req.prompt) if req.tool_choice == "auto" else ())

    def loose_calls(req: protocol.Request):
        """Under tool_choice "auto": a text answer that is one call in JSON becomes it (serve/calls.py)."""
        return tools.LooseCalls(req.tools, tools.made_calls(req.prompt)) if req.tool_choice == "auto" else None

    def calling(req: protocol.Request) -> bool:
        return req.kind == "chat" and bool(req.tools) and req.tool_choice != "none"

    async def sse(job: Job, req: protocol.Request, rid: str):
        created = int(time.time())

        def data(obj) -> str:
            return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"

        def deltas(pieces):             # tool calls: serve/tools.ToolCallStream's delta objects
            for piece in pieces:
                chunk = protocol.chunk_body(req, rid, settings.model, created, None)
                chunk["choices"][0]["delta"] = piece
                yield data(chunk)

        calls = tools.ToolCallStream(loose_calls(req)) if calling(req) else None
        try:
            if req.kind == "chat":
                yield data(protocol.chunk_body(req, rid, settings.model, created, None, first=True))
            while True:
                kind, payload = await job.events.get()
                if kind == "delta" and calls is not None:
                    for line in deltas(calls.feed(payload)):
                        yield line
                elif kind == "delta":
                    yield data(protocol.chunk_body(req, rid, settings.model, created, payload))
                elif kind == "error":
                    yield data(payload.body())
                    break
                elif kind == "done":
                    out: Outcome = payload
                    reason = protocol.finish_reason(out.stop_reason)
                    if calls is not None:
                        for line in deltas(calls.finish()):
                            yield line
                        reason = "tool_calls" if calls.called and reason == "stop" else reason
                    last = protocol.chunk_body(req, rid, settings.model, created, None, reason)
                    last["edgespec"] = out.ext
                    yield data(last)
                    if req.include_usage:
                        yield data({"id": rid, "object": last["object"], "created": created, "model": settings.model,
                                    "choices": [], "usage": protocol.usage(out.prompt_tokens, out.completion_tokens),
                                    "system_fingerprint": None, "edgespec": out.ext})
                    break
            yield "data: [DONE]\n\n"
        finally:
            job.cancel("disconnect")        # no-op once done; stops the generation if the client left

    async def health(request: Request):
        return JSONResponse({"status": "shutting_down" if worker.closing else "ok", "model": settings.model,
                             "busy": worker.busy, "queued": worker.queued, "served": worker.served,
                             "last": worker.last})

    async def models(request: Request):
        try:
            authorize(request)
        except APIError as err:
            return error_response(err)
        return JSONResponse({"object": "list", "data": [{"id": settings.model, "object": "model",
                                                         "created": int(dec.bundle.path.stat().st_mtime),
                                                         "owned_by": "edgespec"}]})

    async def chat(request: Request):
        return await complete(request, "chat")

    async def completions(request: Request):
        return await complete(request, "completion")

    async def http_error(request: Request, exc: HTTPException):
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
        return error_response(APIError(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}",
                                       code=code))

    routes = [Route("/health", health, methods=["GET"]), Route("/v1/models", models, methods=["GET"]),
              Route("/v1/chat/completions", chat, methods=["POST"]),
              Route("/v1/completions", completions, methods=["POST"])]
    return Starlette(routes=routes, exception_handlers={HTTPException: http_error})
