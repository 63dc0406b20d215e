"""POST /v1/responses over the chat route's machinery: serve/responses.py turns the body into the chat
`protocol.Request`, `Api.prepare` checks and tokenises it as for chat, the worker runs it, and
serve/response_events.py writes the Response object or its streaming events. A finished response is
remembered (`ResponseMemory`, when `store` is not false) so that `previous_response_id` can continue it.
"""
from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse

from edgespec.serve import answers, protocol, tools
from edgespec.serve.answers import ClientGone, error_response
from edgespec.serve.errors import APIError
from edgespec.serve.response_events import ResponseStream, response_object, sse, status_of
from edgespec.serve.responses import parse_responses


async def respond(api, request: Request):
    """The route: a Response object, or its SSE events (`stream: true`)."""
    model, seen = api.settings.model, {}

    def parse(body) -> protocol.Request:
        if api.settings.strict_model and isinstance(body, dict) and body.get("model") != model:
            raise APIError(404, f"The model {str(body.get('model'))[:60]!r} does not exist; this server serves "
                                f"'{model}'", param="model", code="model_not_found")
        req, seen["ctx"] = parse_responses(body, model, api.memory)
        return req

    try:
        try:
            p = await api.prepare(request, parse)
            ctx = seen["ctx"]
            if p.req.stream:
                first = api.job(p)
                event = await api.started(request, first, to_end=False)
                if event is None:
                    return api.gone()
                if event[0] == "error":
                    return error_response(ctx.renamed(event[1]))
                return StreamingResponse(_events(api, p, ctx, first), media_type="text/event-stream",
                                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
            outs = await api.run(request, p)
        except APIError as err:
            raise err if "ctx" not in seen else seen["ctx"].renamed(err)
    except APIError as err:
        return error_response(err)
    except ClientGone:
        return api.gone("clients left while sending their body")
    if outs is None:
        return api.gone()
    if isinstance(outs, APIError):
        return error_response(ctx.renamed(outs))
    out = outs[0]
    content, calls = answers.tool_message(p.req, out.text) if answers.calling(p.req) else (out.text, [])
    status, why = status_of(protocol.finish_reason(out.stop_reason))
    api.memory.remember(ctx, content, calls)
    return JSONResponse(response_object(ctx, model, content, calls, out.prompt_tokens, out.completion_tokens,
                                        status, why, ext=_ext(p.req, out)))


def _ext(req: protocol.Request, out) -> dict:
    return dict(out.ext, **({"not_applied": req.not_applied} if req.not_applied else {}))


async def _events(api, p, ctx, job):
    """The response's events as SSE, from response.created to response.completed (or .incomplete, .failed)."""
    stream, req = ResponseStream(ctx, api.settings.model), p.req
    calls = tools.ToolCallStream(answers.loose_calls(req)) if answers.calling(req) else None
    try:
        for event in stream.start():
            yield sse(event)
        while True:
            kind, payload = await job.events.get()
            if kind == "delta":
                pieces = calls.feed(payload) if calls is not None else [{"content": payload}]
                for piece in pieces:
                    for event in stream.feed(piece):
                        yield sse(event)
            elif kind == "error":
                for event in stream.error(payload.message):
                    yield sse(event)
                return
            elif kind == "done":
                for piece in (calls.finish() if calls is not None else []):
                    for event in stream.feed(piece):
                        yield sse(event)
                reason = protocol.finish_reason(payload.stop_reason)
                if calls is not None and calls.called and reason == "stop":
                    reason = "tool_calls"
                events = stream.finish(reason, payload.prompt_tokens, payload.completion_tokens, _ext(req, payload))
                api.memory.remember(ctx, stream.content, stream.calls)
                for event in events:
                    yield sse(event)
                return
    finally:
        job.cancel("disconnect")        # no-op once done; stops the generation if the client left
