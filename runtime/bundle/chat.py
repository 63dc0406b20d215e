"""Chat-template rendering (the bundle's `chat_template.jinja`, HF conventions) with a sandboxed jinja2.

`render_chat(template, messages, bos_token=..., eos_token=...)` returns the prompt text with the
generation prompt appended. Encode the result *without* adding special tokens: templates that want a
BOS write `{{ bos_token }}` themselves. jinja2 is imported at the first compile (`compile_template`,
which the decoder calls while ORT builds the target's session), not with the runtime.
"""
from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache

from edgespec.errors import GenerationError


ROLES = ("system", "user", "assistant", "tool")


def _raise(message):
    raise GenerationError(f"chat template: {message}")


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False) -> str:
    """transformers' `tojson` (apply_chat_template's): json.dumps with keys in order and nothing escaped,
    not jinja2's own (sorted keys, <>&' as \\u003c...), so that a tool call re-rendered in the history is
    what the model wrote (and its KV prefix is reused)."""
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


@lru_cache(maxsize=8)
def compile_template(template: str):
    """The sandboxed jinja2 Template of `template` (compiled once; GenerationError if it does not compile)."""
    from jinja2.exceptions import TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    env.filters["tojson"] = _tojson
    try:
        return env.from_string(template)
    except TemplateError as exc:
        raise GenerationError(f"chat template does not compile: {exc}") from exc


def as_messages(prompt) -> list[dict]:
    """A str becomes one user message; a list of {"role", "content"} dicts is used as is."""
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    if isinstance(prompt, (list, tuple)) and prompt and all(isinstance(m, dict) and "role" in m and "content" in m
                                                            for m in prompt):
        for m in prompt:
            if m["role"] not in ROLES:
                raise GenerationError(f"chat message role must be one of {', '.join(ROLES)}, got {m['role']!r}")
            if not isinstance(m["content"], str):
                raise GenerationError(f"chat message content must be a str, got {type(m['content']).__name__}")
        return [dict(m) for m in prompt]
    raise GenerationError("chat=True needs a str prompt or a list of {'role', 'content'} messages")


def render_chat(template: str | None, messages: list[dict], bos_token: str = "", eos_token: str = "",
                add_generation_prompt: bool = True, tools: list[dict] | None = None) -> str:
    """The prompt text; `tools` (OpenAI function tools) go to the template's `tools` variable."""
    if not template:
        raise GenerationError("chat=True, but this bundle has no chat template")
    from jinja2.exceptions import TemplateError

    try:
        return compile_template(template).render(messages=messages, bos_token=bos_token, eos_token=eos_token,
                                         add_generation_prompt=add_generation_prompt, tools=tools)
    except (TemplateError, OverflowError, ArithmeticError, TypeError, ValueError, LookupError, RecursionError) as exc:
        raise GenerationError(f"chat template failed to render: {type(exc).__name__}: "
                              f"{' '.join(str(exc).split())[:200]}") from exc
