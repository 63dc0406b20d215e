"""The answers of the chat and completions routes: bodies, SSE streams of n choices, tool calls parsed
back, and log-probabilities in OpenAI's two shapes (chat: `logprobs.content`; completions: `tokens`,
`token_logprobs`, `top_logprobs`, `text_offset`). No HTTP here beyond the stream's lines.

A log-probability is the target's own at that position (runtime/samplers/logprobs.py), for each
returned token; the end token that closed the answer is not among them (it is not in the text).
"""
from __future__ import annotations

import json
import time
from functools import lru_cache

from starlette.responses import JSONResponse

from edgespec import jsonio
from edgespec.runtime.bundle.vocab import SPECIAL_PREFIX, token_table
from edgespec.serve import protocol, tools
from edgespec.serve.errors import APIError
from edgespec.serve.worker import Job, Outcome


def error_response(err: APIError) -> JSONResponse:
    return JSONResponse(err.body(), status_code=err.status, headers=err.headers)


class ClientGone(Exception):
    """The client disconnected while sending its body (logged as one counted line, no traceback)."""


def decode_body(raw: bytes):
    """The JSON body, or a 400 naming what is wrong (not JSON, nested past the parser, a lone surrogate)."""
    try:
        body = jsonio.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise APIError(400, f"the request body is not valid JSON ({exc})", code="invalid_json") from None
    found = _first_surrogate(body)
    if found is not None:
        where, ch = found
        raise APIError(400, f"'{where or 'body'}' holds a lone UTF-16 surrogate (U+{ch:04X}): JSON text must be valid "
                            "Unicode", param=where or None, code="invalid_json")
    return body


def _first_surrogate(body) -> tuple[str, int] | None:
    """(the field's path, the code point) of the first string (key or value) that is not Unicode."""
    stack = [("", body)]
    while stack:
        path, x = stack.pop()
        items = x.items() if isinstance(x, dict) else enumerate(x) if isinstance(x, list) else ()
        for k, v in items:
            here = f"{path}[{k}]" if isinstance(k, int) else (f"{path}.{k}" if path else str(k))
            for text in ((k, v) if isinstance(k, str) else (v,)):
                if isinstance(text, str):
                    try:
                        text.encode("utf-8")
                    except UnicodeEncodeError as exc:
                        return here, ord(text[exc.start])
            if isinstance(v, (dict, list)):
                stack.append((here, v))
    if isinstance(body, str):
        try:
            body.encode("utf-8")
        except UnicodeEncodeError as exc:
            return "", ord(body[exc.start])
    return None


# ---------------------------------------------------------------------------------- tool calls
def calling(req: protocol.Request) -> bool:
    return req.kind == "chat" and bool(req.tools) and req.tool_choice != "none"


def guard(req: protocol.Request):
    """The tool-call guard of a request (serve/calls.py); under "auto" it knows the calls made."""
    if not calling(req):
        return None
    return tools.CallGuard(req.parallel_tool_calls, tools.made_calls(req.prompt) if req.tool_choice == "auto" else ())


def loose_calls(req: protocol.Request):
    """Under tool_choice "auto": a text answer that is one call in JSON becomes it (serve/calls.py)."""
    return tools.LooseCalls(req.tools, tools.made_calls(req.prompt)) if req.tool_choice == "auto" else None


def tool_message(req: protocol.Request, text: str) -> tuple[str | None, list[dict]]:
    """(content, tool_calls) of a complete answer (calls.CallGuard let only complete calls through)."""
    content, calls = tools.parse_tool_calls(text)
    loose = loose_calls(req)
    if not calls and loose is not None and (call := loose(text)) is not None:
        content, calls = None, [call]
    return content, calls


# ---------------------------------------------------------------------------------- logprobs
@lru_cache(maxsize=4)
def _keys(tokenizer) -> list:
    return token_table(tokenizer).keys


def token_piece(tokenizer, token_id: int) -> tuple[str, list[int]]:
    """A token's text (replacement characters where it holds part of a character) and its bytes."""
    keys = _keys(tokenizer)
    key = keys[token_id] if 0 <= token_id < len(keys) else None
    if key is None:
        return "", []
    if key.startswith(SPECIAL_PREFIX):
        key = key[len(SPECIAL_PREFIX):]
    return key.decode("utf-8", errors="replace"), list(key)


def shown(entries, eos_ids, stop_reason: str) -> list:
    """The entries of the returned tokens: without the end token that closed the answer."""
    if entries and stop_reason == "eos" and entries[-1].token_id in eos_ids:
        return entries[:-1]
    return list(entries)


def chat_logprobs(tokenizer, entries) -> dict:
    def one(token_id, logprob):
        text, raw = token_piece(tokenizer, token_id)
        return {"token": text, "logprob": logprob, "bytes": raw}

    return {"content": [dict(one(e.token_id, e.logprob), top_logprobs=[one(i, lp) for i, lp in e.top])
                        for e in entries], "refusal": None}


def completion_logprobs(tokenizer, entries, offset: int = 0) -> dict:
    tokens, offsets = [], []
    for e in entries:
        offsets.append(offset)
        text = token_piece(tokenizer, e.token_id)[0]
        tokens.append(text)
        offset += len(text)
    return {"tokens": tokens, "token_logprobs": [e.logprob for e in entries],
            "top_logprobs": [{token_piece(tokenizer, i)[0]: lp for i, lp in e.top} for e in entries],
            "text_offset": offsets}


def logprobs_body(api, req: protocol.Request, entries, offset: int = 0) -> dict:
    tok = api.dec.bundle.target.tokenizer
    return chat_logprobs(tok, entries) if req.kind == "chat" else completion_logprobs(tok, entries, offset)


# ---------------------------------------------------------------------------------- plain bodies
def _ext(req: protocol.Request, outs: list[Outcome]) -> dict:
    ext = dict(outs[-1].ext)
    if req.not_applied:
        ext["not_applied"] = req.not_applied
    if len(outs) > 1:
        ext["choices"] = [o.ext for o in outs]
    return ext


def _usage(p, outs: list[Outcome]) -> dict:
    """Each prompt counted once (a prompt's n choices read it once), every completion token."""
    prompts = sum(outs[i].prompt_tokens for i in range(0, len(outs), p.req.n))
    return protocol.usage(prompts, sum(o.completion_tokens for o in outs))


def full_body(api, p, outs: list[Outcome], model: str) -> dict:
    req, choices = p.req, []
    for i, out in enumerate(outs):
        lp = None
        if req.logprobs is not None:
            lp = logprobs_body(api, req, shown(out.logprobs or [], api.dec.bundle.target.eos_ids, out.stop_reason))
        choice = protocol.choice_body(req, i, out.text, protocol.finish_reason(out.stop_reason), lp)
        if calling(req):             # complete calls only (calls.CallGuard); cut by max_tokens: "length"
            content, calls = tool_message(req, out.text)
            if calls:
                choice["message"].update(content=content, tool_calls=calls)
                if choice["finish_reason"] == "stop":
                    choice["finish_reason"] = "tool_calls"
        choices.append(choice)
    use = _usage(p, outs)
    return protocol.full_body(req, protocol.new_id(req.kind), model, choices, use, _ext(req, outs))


# ---------------------------------------------------------------------------------- streams
def _data(obj) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


async def sse(api, p, first: Job, model: str):
    """The SSE stream of all n choices, one after another; `first` has started. Ends in [DONE]."""
    req, rid, created = p.req, protocol.new_id(p.req.kind), int(time.time())
    outs, job = [], first
    try:
        for i in range(p.choices):
            if i > 0:
                try:
                    job = api.job(p, i)
                except APIError as err:
                    yield _data(err.body())
                    break
                kind, payload = await job.events.get()
                if kind == "error":
                    yield _data(payload.body())
                    break
            out = None
            async for line, out in _choice(api, req, rid, model, created, job, i):
                if line:
                    yield line
            if out is None:
                break
            outs.append(out)
        if outs and req.include_usage and len(outs) == p.choices:
            yield _data({"id": rid, "object": "chat.completion.chunk" if req.kind == "chat" else "text_completion",
                         "created": created, "model": model, "choices": [],
                         "usage": _usage(p, outs),
                         "system_fingerprint": None, "edgespec": _ext(req, outs)})
        yield "data: [DONE]\n\n"
    finally:
        job.cancel("disconnect")        # no-op once done; stops the generation if the client left


async def _choice(api, req, rid, model, created, job: Job, index: int):
    """(line, None) per chunk of one choice, then ("", Outcome) at its end (None after an error)."""
    def chunk(text=None, reason=None, first=False, logprobs=None):
        return protocol.chunk_body(req, rid, model, created, text, reason, first=first, index=index,
                                   logprobs=logprobs)

    calls = tools.ToolCallStream(loose_calls(req)) if calling(req) else None
    eos, pending, offset = api.dec.bundle.target.eos_ids, [], 0
    if req.kind == "chat":
        yield _data(chunk(first=True)), None
    while True:
        kind, payload = await job.events.get()
        if kind == "logprobs":
            pending += payload
        elif kind == "delta" and calls is not None:
            for piece in calls.feed(payload):
                c = chunk()
                c["choices"][0]["delta"] = piece
                yield _data(c), None
        elif kind == "delta":
            lp = None
            if req.logprobs is not None:
                lp, pending = logprobs_body(api, req, [e for e in pending if e.token_id not in eos], offset), []
                offset += len(payload)
            yield _data(chunk(payload, logprobs=lp)), None
        elif kind == "error":
            yield _data(payload.body()), None
            yield "", None
            return
        elif kind == "done":
            out: Outcome = payload
            reason = protocol.finish_reason(out.stop_reason)
            if calls is not None:
                for piece in calls.finish():
                    c = chunk()
                    c["choices"][0]["delta"] = piece
                    yield _data(c), None
                reason = "tool_calls" if calls.called and reason == "stop" else reason
            last = chunk(reason=reason)
            last["edgespec"] = _ext(req, [out])
            yield _data(last), None
            yield "", out
            return
