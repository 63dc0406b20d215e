"""The model's answer as OpenAI tool calls (serve/tools.py renders the tools and constrains the answer).

- `parse_tool_calls(text)`: the complete `<tool_call>` blocks of an answer as OpenAI's `tool_calls`;
- `ToolCallStream`: streamed text -> tool-call deltas as it is generated;
- `LooseCalls`: under tool_choice "auto", a text answer that is one call written as a bare JSON object
  or a ```json block (`{"name": ..., "arguments": {...}}`, Qwen2.5-Coder's habit: llama.cpp's Hermes
  parser reads these too) of a tool the request offers, with its required arguments, becomes that call;
  the stream holds such an answer back until it ends. A call the conversation already made stays text;
- `CallGuard`: between the decoder and the client (serve/worker.py). It holds a call back until its
  `</tool_call>` is written, so that no client ever gets a half-written call (a cut answer ends with
  the calls that were complete, finish_reason "length"), and, where parallel calls are allowed, ends
  the answer at the first call that repeats one already made (same name, same arguments): small
  models repeat a call until max_tokens. The grammar caps the number of calls (tools.MAX_CALLS).
  Under tool_choice "auto" a call the conversation already made (its result is in the history) also
  ends it, and the server answers in text instead (serve/worker.py): small models call the same tool
  again at every step of an agent loop, which then never ends.
"""
from __future__ import annotations

import json
import re
import uuid

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_CALL = re.compile(r"<tool_call>\n(.*?)\n</tool_call>", re.S)


def _call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


def parse_tool_calls(text: str) -> tuple[str | None, list[dict]]:
    """(content, tool_calls) of an answer: every <tool_call> block whose body is a JSON object with a
    name becomes a call (arguments as JSON text); the rest is the content (None if nothing is left)."""
    calls = []
    for m in _CALL.finditer(text):
        try:
            obj = json.loads(m.group(1))
        except ValueError:
            continue
        if isinstance(obj, dict) and isinstance(obj.get("name"), str):
            head = '{"name": ' + json.dumps(obj["name"]) + ToolCallStream.MID[1:]
            body = m.group(1)          # the arguments as generated (as ToolCallStream sends them), if laid out so
            args = body[len(head):-1] if body.startswith(head) and body.endswith("}") else \
                json.dumps(obj.get("arguments", {}), ensure_ascii=False)
            calls.append({"id": _call_id(), "type": "function", "function": {"name": obj["name"], "arguments": args}})
    if not calls:
        return text, []
    rest = _CALL.sub("", text).strip()
    return rest or None, calls


_FENCED = re.compile(r"```(?:json)?[ \t]*\n(.*?)\n?[ \t]*```", re.S)
LOOSE_STARTS = ("```json", "```\n{", "{")     # how a loose call's text begins (after whitespace)


class LooseCalls:
    """A text answer that is one whole tool call in JSON (module docstring) -> that call, else None."""

    def __init__(self, tools: list[dict], made=()):
        self.params = {t["function"]["name"]: t["function"].get("parameters") or {} for t in tools}
        self.made = frozenset(made)

    def __call__(self, text: str) -> dict | None:
        body = text.strip()
        m = _FENCED.fullmatch(body)
        body = m.group(1).strip() if m else body
        if not body.startswith("{"):
            return None
        try:
            obj = json.loads(body)
        except ValueError:
            return None
        if not isinstance(obj, dict) or set(obj) - {"name", "arguments"} or obj.get("name") not in self.params:
            return None
        name, args = obj["name"], obj.get("arguments", {})
        params = self.params[name]
        if not isinstance(args, dict) or any(k not in args for k in params.get("required", ())) or \
                (params.get("additionalProperties") is False and set(args) - set(params.get("properties", {}))):
            return None
        if (name, json.dumps(args, sort_keys=True)) in self.made:
            return None
        return {"id": _call_id(), "type": "function",
                "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False)}}

    @staticmethod
    def may_start(text: str) -> bool | None:
        """True: the text starts as a loose call would; None: too short to tell; False: it does not."""
        t = text.lstrip()
        if any(t.startswith(p) for p in LOOSE_STARTS):
            return True
        return None if not t or any(p.startswith(t) for p in LOOSE_STARTS) else False


class ToolCallStream:
    """Streamed text -> OpenAI tool-call deltas, as it is generated. The grammar fixes the layout:
    `<tool_call>\n{"name": "NAME", "arguments": ARGS}\n</tool_call>`, calls separated by "\n"; the
    name is sent once it is complete, ARGS in pieces (held back by the length of the closing text)."""
    HEAD = OPEN + '\n{"name": "'
    MID = '", "arguments": '
    TAIL = "}\n" + CLOSE

    def __init__(self, loose: LooseCalls | None = None):
        self.buf = ""
        self.index = -1
        self.loose = loose            # under tool_choice "auto": a whole answer that is a call in JSON
        self.state = "start"          # start | text | hold (maybe a loose call) | head | args
        self.sent = 0                 # args characters sent for the current call

    def feed(self, delta: str) -> list[dict]:
        """Delta objects ({"content": ...} or {"tool_calls": [...]}) for the next piece of text."""
        self.buf += delta
        out = []
        while True:
            if self.state == "start":
                if self.called:                   # the "\n" between two calls
                    self.buf = self.buf.lstrip("\n")
                if not self.buf:
                    return out
                if self.buf[0] != "<":
                    maybe = LooseCalls.may_start(self.buf) if self.loose and not self.called else False
                    if maybe is None:
                        return out
                    self.state = "hold" if maybe else "text"
                    continue
                if len(self.buf) < len(self.HEAD):
                    return out
                self.state = "head"
            if self.state == "hold":
                return out
            if self.state == "text":
                if self.buf:
                    out.append({"content": self.buf})
                self.buf = ""
                return out
            if self.state == "head":
                end = self.buf.find(self.MID, len(self.HEAD))
                if end < 0:
                    return out
                self.index += 1
                name = self.buf[len(self.HEAD):end]
                out.append({"tool_calls": [{"index": self.index, "id": _call_id(), "type": "function",
                                            "function": {"name": name, "arguments": ""}}]})
                self.buf = self.buf[end + len(self.MID):]
                self.state = "args"
            if self.state == "args":
                end = self.buf.find(self.TAIL)
                ready = self.buf[:end] if end >= 0 else self.buf[:max(0, len(self.buf) - len(self.TAIL))]
                if ready:
                    out.append({"tool_calls": [{"index": self.index, "function": {"arguments": ready}}]})
                if end < 0:
                    self.buf = self.buf[len(ready):]
                    return out
                self.buf = self.buf[end + len(self.TAIL):]
                self.state = "start"

    def finish(self) -> list[dict]:
        """What is left at the end (a cut answer's tail)."""
        rest, self.buf = self.buf, ""
        if not rest:
            return []
        call = self.loose(rest) if self.loose and self.state in ("start", "hold") and not self.called else None
        if call is not None:
            self.index += 1
            return [{"tool_calls": [dict(call, index=self.index)]}]
        if self.state == "args":
            return [{"tool_calls": [{"index": self.index, "function": {"arguments": rest}}]}]
        return [{"content": rest}]

    @property
    def called(self) -> bool:
        return self.index >= 0


class CallGuard:
    """Text released to the client as generated, tool calls whole (module docstring). `feed(delta)`
    returns the text to release now; `done` turns true at a repeated call (parallel calls only), whose
    text is never released: the generation stops there. `text` is everything released."""

    def __init__(self, parallel: bool, made=()):
        self.parallel = parallel
        self.made = frozenset(made)      # calls the conversation already made (tool_choice "auto" only)
        self.buf = ""
        self.text = ""
        self.done = False
        self.repeated = False            # done at a call of `made`: the answer should be text instead
        self.seen: set[tuple[str, str]] = set()

    def passthrough(self) -> "CallGuard":
        """This guard, ready to pass a text answer after it ended at a call already made."""
        self.done = self.repeated = False
        self.made, self.buf = frozenset(), ""
        return self

    def feed(self, delta: str) -> str:
        if self.done:
            return ""
        self.buf += delta
        out = ""
        while True:
            start = self.buf.find(OPEN)
            if start < 0:                      # no call started: hold back only what may begin one
                keep = next((k for k in range(min(len(OPEN) - 1, len(self.buf)), 0, -1)
                             if OPEN.startswith(self.buf[-k:])), 0)
                out += self.buf[:len(self.buf) - keep]
                self.buf = self.buf[len(self.buf) - keep:]
                break
            end = self.buf.find(CLOSE, start)
            if end < 0:                        # a call being written: held back whole
                out += self.buf[:start]
                self.buf = self.buf[start:]
                break
            end += len(CLOSE)
            block = self.buf[start:end]
            key = _call_key(block)
            if key is not None and (key in self.made or (key in self.seen and self.parallel)):
                self.done, self.repeated, self.buf = True, key in self.made, ""
                break
            if key is not None:
                self.seen.add(key)
            out += self.buf[:end]
            self.buf = self.buf[end:]
        self.text += out
        return out

    def finish(self) -> str:
        """The rest at the end: a call left unfinished (cut by max_tokens) is dropped, other text released."""
        rest, self.buf = ("" if self.done or self.buf.startswith("<") else self.buf), ""
        self.text += rest
        return rest


def _call_key(block: str) -> tuple[str, str] | None:
    """(name, arguments as canonical JSON) of one complete <tool_call> block (None: not a call)."""
    m = _CALL.fullmatch(block)
    try:
        obj = json.loads(m.group(1)) if m else None
    except ValueError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    return obj["name"], json.dumps(obj.get("arguments"), sort_keys=True)


def made_calls(messages: list[dict]) -> set[tuple[str, str]]:
    """(name, canonical arguments) of every call the assistant made in a checked conversation."""
    return {(c["function"]["name"], json.dumps(c["function"]["arguments"], sort_keys=True))
            for m in messages for c in m.get("tool_calls", ())}
