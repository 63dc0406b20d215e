"""Chat prompts to token ids, where message content never becomes control tokens.

A chat template writes control tokens (`<|im_start|>`, `<|im_end|>`) around each message. Encoded
whole, a message that holds the same text (a pasted log, a tool result from a web page) would become
those control tokens too and could forge a turn. `encode_chat` renders the conversation, finds where
each message's content lies in the text (the template rendered again with a placeholder per content),
and tokenises special-token text inside content as plain text (tokenizers' `encode_special_tokens`):
the template's own control tokens stay control tokens. Content without special-token text is encoded
exactly as the whole rendered text always was (the fast path: one `encode` call).

`parse_special=True` is the opt-in to the old reading (a caller who writes control tokens on purpose).
"""
from __future__ import annotations

import re
import threading

from edgespec.errors import GenerationError
from edgespec.runtime.bundle.chat import render_chat
from edgespec.runtime.bundle.text import require_text

_FLAG_LOCK = threading.Lock()      # encode_special_tokens is a tokenizer-wide flag


def special_strings(tokenizer) -> list[str]:
    """The text of every special added token, longest first (the order tokenizers matches them in)."""
    specials = [t.content for t in tokenizer.get_added_tokens_decoder().values() if t.special and t.content]
    return sorted(set(specials), key=len, reverse=True)


def encode_chat(tokenizer, template: str, messages: list[dict], bos_token: str = "", eos_token: str = "",
                tools: list[dict] | None = None, parse_special: bool = False) -> list[int]:
    """Target ids of `messages` rendered with the bundle's template (and `tools`), the generation prompt
    appended; special-token text inside a message's content is plain text unless `parse_special`."""
    text = require_text(render_chat(template, messages, bos_token=bos_token, eos_token=eos_token, tools=tools),
                        "the chat text")
    specials = special_strings(tokenizer)
    tainted = [i for i, m in enumerate(messages)
               if isinstance(m.get("content"), str) and any(s in m["content"] for s in specials)]
    if parse_special or not tainted:
        return tokenizer.encode(text, add_special_tokens=False).ids
    spans = _content_spans(template, messages, tainted, text, bos_token, eos_token, tools)
    return _encode_with_plain_spans(tokenizer, text, spans, specials)


def _content_spans(template, messages, tainted, text, bos_token, eos_token, tools) -> list[tuple[int, int]]:
    """Where each tainted message's content lies in `text`: rendered again with a private-use placeholder
    per content, the pieces around the placeholders must match `text` exactly, or the template rewrites
    content (trims, escapes) and the content cannot be told from the template: refused in one line."""
    marks = {i: f"\ue000{i}\ue001" for i in tainted}
    masked = [dict(m, content=marks[i]) if i in marks else m for i, m in enumerate(messages)]
    skeleton = render_chat(template, masked, bos_token=bos_token, eos_token=eos_token, tools=tools)
    spans, pos, shift = [], 0, 0
    for i in tainted:
        at = skeleton.find(marks[i], pos)
        if at < 0 or skeleton.count(marks[i]) != 1:
            raise _rewritten(messages[i])
        start = at + shift
        content = messages[i]["content"]
        if text[start:start + len(content)] != content:
            raise _rewritten(messages[i])
        spans.append((start, start + len(content)))
        pos = at + len(marks[i])
        shift += len(content) - len(marks[i])
    rebuilt = skeleton
    for i in tainted:
        rebuilt = rebuilt.replace(marks[i], messages[i]["content"], 1)
    if rebuilt != text:
        raise _rewritten(messages[tainted[0]])
    return spans


def _rewritten(message: dict) -> GenerationError:
    return GenerationError(f"a {message.get('role', 'chat')} message holds special-token text that the chat template "
                           "rewrites, so it cannot be kept as plain text; remove it or ask for parse_special")


def _encode_with_plain_spans(tokenizer, text: str, spans: list[tuple[int, int]], specials: list[str]) -> list[int]:
    """`text` encoded as tokenizers would, except that special-token text inside `spans` is plain text.
    tokenizers splits the text at every special token before anything else, so encoding the pieces
    between the template's own special tokens one by one (special text inside them as plain text) and
    putting those tokens' ids between them is the whole-text encoding with only the content changed."""
    pattern = re.compile("|".join(re.escape(s) for s in specials))
    ids_of = {s: tokenizer.token_to_id(s) for s in specials}
    cuts = [m for m in pattern.finditer(text)
            if not any(a < m.end() and m.start() < b for a, b in spans)]
    out, pos = [], 0
    with _FLAG_LOCK:
        tokenizer.encode_special_tokens = True
        try:
            for m in cuts:
                if m.start() > pos:
                    out += tokenizer.encode(text[pos:m.start()], add_special_tokens=False).ids
                out.append(ids_of[m.group()])
                pos = m.end()
            if pos < len(text):
                out += tokenizer.encode(text[pos:], add_special_tokens=False).ids
        finally:
            tokenizer.encode_special_tokens = False
    return out
