"""The output of POST /v1/responses (serve/responses.py parses the request), no HTTP here.

- `response_object(ctx, model, content, calls, ...)`: the whole Response object of a finished answer
  (a message item for its text, a function_call item per call, usage, status completed or incomplete).
- `ResponseStream(ctx, model)`: the same answer as OpenAI's streaming events, from the chat route's
  delta objects (serve/calls.ToolCallStream): `start()`, `feed(delta)` as text and calls arrive,
  `finish(reason, ...)` (every open part and item done, then response.completed or response.incomplete
  whose response is what `response_object` gives for the same output), or `error(message)`.
  Each event carries an increasing `sequence_number`; items are written one after the other (a new item
  closes the one before), as the openai client's stream accumulator expects: output_item.added with
  empty content, then content_part.added, the deltas, and the .done events before response.completed.
- `sse(event)`: one event as server-sent-events text.

Item ids are derived from the response id and the item's output index, so the streamed items and the
final object name the same items.
"""
from __future__ import annotations

import copy
import json
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from edgespec.serve.responses import ResponseContext


def status_of(finish_reason: str | None) -> tuple[str, str | None]:
    """(status, incomplete reason) of the chat route's finish_reason (stop | length | tool_calls)."""
    if finish_reason in ("length", "max_tokens"):
        return "incomplete", "max_output_tokens"
    return "completed", None


def usage(usage_in: int, usage_out: int) -> dict:
    return {"input_tokens": usage_in, "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens": usage_out, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": usage_in + usage_out}


def _item_id(ctx: "ResponseContext", kind: str, index: int) -> str:
    return f"{kind}_{ctx.hex}_{index}"


def _part(text: str) -> dict:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _message(ctx: "ResponseContext", index: int, text: str | None, status: str) -> dict:
    """A message item (content [] while it is only added: its part comes with content_part.added)."""
    return {"type": "message", "id": _item_id(ctx, "msg", index), "status": status, "role": "assistant",
            "content": [] if text is None else [_part(text)]}


def _call(ctx: "ResponseContext", index: int, call_id: str, name: str, arguments: str, status: str) -> dict:
    return {"type": "function_call", "id": _item_id(ctx, "fc", index), "call_id": call_id, "name": name,
            "arguments": arguments, "status": status}


def _response(ctx: "ResponseContext", model: str, output: list[dict], status: str, use: dict | None = None,
              incomplete_reason: str | None = None, error: dict | None = None, ext: dict | None = None) -> dict:
    body = {"id": ctx.id, "object": "response", "created_at": ctx.created_at, "status": status, "error": error,
            "incomplete_details": {"reason": incomplete_reason} if incomplete_reason else None, "model": model,
            "output": output, "usage": use, **copy.deepcopy(ctx.echo)}
    if ext is not None:
        body["edgespec"] = ext
    return body


def response_object(ctx: "ResponseContext", model: str, content: str | None, calls: list[dict], usage_in: int,
                    usage_out: int, status: str = "completed", incomplete_reason: str | None = None,
                    ext: dict | None = None) -> dict:
    """The Response of an answer: `content` (text; None or "" for none) then `calls` (chat-format tool
    calls: {"id", "type", "function": {"name", "arguments"}}). An answer with neither is one empty
    message. Where it stopped at max_output_tokens (status "incomplete"), its last message is incomplete."""
    output = []
    if content or not calls:
        cut = status == "incomplete" and not calls
        output.append(_message(ctx, 0, content or "", "incomplete" if cut else "completed"))
    for c in calls:
        f = c["function"]
        args = f["arguments"] if isinstance(f["arguments"], str) else json.dumps(f["arguments"], ensure_ascii=False)
        output.append(_call(ctx, len(output), c["id"], f["name"], args, "completed"))
    if status == "incomplete" and incomplete_reason is None:
        incomplete_reason = "max_output_tokens"
    return _response(ctx, model, output, status, usage(usage_in, usage_out), incomplete_reason, ext=ext)


class ResponseStream:
    """One response's streaming events (module docstring). After `finish`, `content` and `calls` are the
    answer (as `response_object` and `ResponseMemory.remember` take it)."""

    def __init__(self, ctx: "ResponseContext", model: str):
        self.ctx, self.model = ctx, model
        self.seq = 0
        self.items: list[dict] = []        # the output items as they stand
        self.open: int | None = None       # output index of the item being written
        self.by_call: dict[int, int] = {}  # the delta's tool-call index -> output index
        self.done = False

    def _event(self, type_: str, **fields) -> dict:
        event = {"type": type_, "sequence_number": self.seq, **fields}
        self.seq += 1
        return event

    def start(self) -> list[dict]:
        """response.created and response.in_progress (status in_progress, no output yet)."""
        return [self._event(t, response=_response(self.ctx, self.model, [], "in_progress"))
                for t in ("response.created", "response.in_progress")]

    def feed(self, delta: dict) -> list[dict]:
        """The events of one delta object: {"content": text} or {"tool_calls": [...]} (a call's start has
        its "id" and function "name"; its argument pieces follow under the same "index")."""
        if self.done:
            raise ValueError("the response is finished")
        out = []
        text = delta.get("content")
        if text:
            if self.open is None or self.items[self.open]["type"] != "message":
                out += self._close()
                out += self._open_message()
            item = self.items[self.open]
            item["content"][0]["text"] += text
            out.append(self._event("response.output_text.delta", item_id=item["id"], output_index=self.open,
                                   content_index=0, delta=text, logprobs=[]))
        for tc in delta.get("tool_calls") or ():
            f = tc.get("function") or {}
            if tc.get("id") is not None:             # a call starts
                out += self._close()
                index = len(self.items)
                self.items.append(_call(self.ctx, index, tc["id"], f["name"], "", "in_progress"))
                self.open, self.by_call[tc["index"]] = index, index
                out.append(self._event("response.output_item.added", output_index=index,
                                       item=copy.deepcopy(self.items[index])))
            index = self.by_call.get(tc.get("index"))
            if index is None or index != self.open:
                raise ValueError(f"arguments for tool call {tc.get('index')!r}, which is not being written")
            piece = f.get("arguments") or ""
            if piece:
                item = self.items[index]
                item["arguments"] += piece
                out.append(self._event("response.function_call_arguments.delta", item_id=item["id"],
                                       output_index=index, delta=piece))
        return out

    def _open_message(self) -> list[dict]:
        index = len(self.items)
        item = _message(self.ctx, index, None, "in_progress")
        self.items.append(item)
        self.open = index
        added = self._event("response.output_item.added", output_index=index, item=copy.deepcopy(item))
        item["content"].append(_part(""))
        return [added, self._event("response.content_part.added", item_id=item["id"], output_index=index,
                                   content_index=0, part=_part(""))]

    def _close(self, status: str = "completed") -> list[dict]:
        """The .done events of the item being written."""
        if self.open is None:
            return []
        index, item = self.open, self.items[self.open]
        self.open = None
        item["status"] = status
        out = []
        if item["type"] == "message":
            part = item["content"][0]
            out.append(self._event("response.output_text.done", item_id=item["id"], output_index=index,
                                   content_index=0, text=part["text"], logprobs=[]))
            out.append(self._event("response.content_part.done", item_id=item["id"], output_index=index,
                                   content_index=0, part=copy.deepcopy(part)))
        else:
            out.append(self._event("response.function_call_arguments.done", item_id=item["id"], output_index=index,
                                   name=item["name"], arguments=item["arguments"]))
        out.append(self._event("response.output_item.done", output_index=index, item=copy.deepcopy(item)))
        return out

    def finish(self, reason: str | None, usage_in: int, usage_out: int, ext: dict | None = None) -> list[dict]:
        """The closing events, then response.completed, or response.incomplete where `reason` (the chat
        finish_reason) is "length": the answer stopped at max_output_tokens."""
        if self.done:
            raise ValueError("the response is finished")
        status, why = status_of(reason)
        out = [] if self.items else self._open_message()      # an empty answer is one empty message
        is_message = self.open is not None and self.items[self.open]["type"] == "message"
        out += self._close("incomplete" if status == "incomplete" and is_message else "completed")
        self.done = True
        body = _response(self.ctx, self.model, copy.deepcopy(self.items), status, usage(usage_in, usage_out), why,
                         ext=ext)
        out.append(self._event(f"response.{status}", response=body))
        return out

    def error(self, message: str) -> list[dict]:
        """An "error" event, then response.failed with the output written so far (its open item incomplete)."""
        if self.done:
            return []
        self.done = True
        if self.open is not None:
            self.items[self.open]["status"] = "incomplete"
            self.open = None
        err = {"code": "server_error", "message": message}
        return [self._event("error", code="server_error", message=message, param=None),
                self._event("response.failed", response=_response(self.ctx, self.model, copy.deepcopy(self.items),
                                                                  "failed", error=err))]

    @property
    def content(self) -> str | None:
        """The answer's text (None if it has none)."""
        texts = [i["content"][0]["text"] for i in self.items if i["type"] == "message" and i["content"]]
        return "".join(texts) or None

    @property
    def calls(self) -> list[dict]:
        """The answer's calls in chat format (arguments as JSON text)."""
        return [{"id": i["call_id"], "type": "function", "function": {"name": i["name"], "arguments": i["arguments"]}}
                for i in self.items if i["type"] == "function_call"]


def sse(event: dict) -> str:
    """One event as server-sent events: `event: TYPE`, `data: JSON`, a blank line."""
    return f"event: {event['type']}\ndata: {json.dumps(event, ensure_ascii=False)}\n\n"
