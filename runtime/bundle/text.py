"""Incremental detokenisation for streaming, and stop strings; the check that input text is Unicode.

`TextState.update(ids)` decodes the generated ids (the target tokenizer, skipping special tokens) and
looks for stop strings in the new text; `take()` returns the next delta. A delta never ends in a
half-decoded character (trailing U+FFFD, which more bytes may complete) nor in a prefix of a stop
string; the concatenated deltas equal the final text.
"""
from __future__ import annotations

from edgespec.errors import GenerationError

_REPLACEMENT = "\ufffd"


def require_text(text: str, what: str) -> str:
    """`text`, or a one-line GenerationError where it is not Unicode: a lone surrogate is not (Python makes
    U+DC80..U+DCFF of bytes that were not UTF-8, from argv or stdin under the C locale), and the tokenizer
    cannot encode one. The rule is to refuse, not replace, so that what runs is what the user wrote."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError as exc:
        ch = ord(text[exc.start])
        problem = f"byte 0x{ch - 0xDC00:02x}, not UTF-8" if 0xDC80 <= ch <= 0xDCFF else f"lone surrogate U+{ch:04X}"
        raise GenerationError(f"{what} is not valid text ({problem}, at character {exc.start}); edgespec reads "
                              "text as UTF-8") from None


class TextState:
    """Incremental detokenisation: text deltas that never end in a half-decoded character or in a
    prefix of a stop string, and stop-string detection."""

    def __init__(self, tokenizer, stops: list[str]):
        self.tok = tokenizer
        self.stops = stops
        self.max_stop = max((len(s) for s in stops), default=0)
        self.emitted = ""
        self.final_text = ""
        self.searched = 0            # text before this index holds no stop string
        self.stopped_at: int | None = None   # token count to keep after a stop string

    def _decode(self, ids) -> str:
        return self.tok.decode(ids, skip_special_tokens=True)

    def update(self, ids: list[int], reason: str | None) -> str | None:
        text = self._decode(ids)
        if self.stops:
            start = max(0, self.searched - self.max_stop - 4)   # slack: a trailing U+FFFD may resolve
            hits = [(i, s) for s in self.stops if (i := text.find(s, start)) >= 0]
            if hits:
                pos, s = min(hits)
                text = text[:pos]
                m = len(ids)
                while m > 1 and s in self._decode(ids[:m - 1])[pos:]:
                    m -= 1
                self.stopped_at = m
                reason = "stop"
            self.searched = len(text)
        self.final_text = text
        return reason

    def take(self, final: bool) -> str:
        text = self.final_text
        if not final:
            text = text.rstrip(_REPLACEMENT)
            for k in range(min(self.max_stop - 1, len(text)), 0, -1):
                if any(s.startswith(text[-k:]) for s in self.stops):
                    text = text[:-k]
                    break
        if not text.startswith(self.emitted):
            return ""
        delta = text[len(self.emitted):]
        self.emitted = text
        return delta
