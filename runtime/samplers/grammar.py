"""Constrained decoding (docs/structured-output.md): a JSON schema, any JSON object, a regex or a Lark
grammar, compiled by llguidance into a token-level matcher over the target's vocabulary.

`compile_constraint(...)` turns the user's arguments into an llguidance grammar string and checks it
(a bad schema/regex/grammar is a one-line GenerationError before any model runs). `GrammarState` is
one generation's matcher, in step with the decode round (rounds.py):
- the committed tokens are consumed by `matcher`, which is never rolled back; the drafts of the
  round in flight are consumed by a copy of it (`draft`, `block_masks`: `deep_copy()`, made at the
  round's first draft), dropped at `commit`, which consumes the accepted drafts and the target's token
  on `matcher` (or keeps the copy when every draft was accepted). llguidance's `rollback` can leave a
  wrong mask behind (docs/structured-output.md has the sequence; tests/test_grammar_rollback.py replays
  it), and a wrong mask breaks both the output's validity and the lossless rule;
- a draft the matcher refuses is a rejected draft (its row then forbids it), never an error;
- `block_masks(drafts)` gives the allowed-token mask of every verify row: row j predicts the token after
  drafts[:j]. Rows after the first draft the grammar forbids are never used (that draft is rejected at
  the row before), so they are left unmasked;
- `mask_logits` sets forbidden logits to -inf: greedy argmax and the sampler's p then are those of the
  constrained target, so verification is judged against the constrained distribution;
- `forced()`: the tokens the grammar allows as the only continuation (llguidance's fast-forward
  tokens), drafted for free (rounds.forced_round).

JSON schemas: the layout is JSON_OPTIONS (the model's own line breaks and indents, bounded) unless the
schema's "x-guidance" names one of LAYOUT_KEYS (then llguidance's defaults and the schema's own keys). An
unknown `format` is an annotation (as JSON Schema has it): the schema compiles without it and
`Constraint.notes` says so in one line. Approximations are
the schema's own choice, through llguidance's `"x-guidance"` key in it: `{"coerce_one_of": true}`
(oneOf as anyOf), `{"lenient": true}` (keys llguidance does not implement, and min/maxProperties over
optional keys, ignored); the refusals name them.

llguidance (Rust, no torch, ~8 MB) comes with the `[serve]` extra (and `[grammar]`): import errors say so.
"""
from __future__ import annotations

import re

import time
from dataclasses import dataclass

import numpy as np

from edgespec import jsonio
from edgespec.errors import GenerationError
from edgespec.runtime.samplers.sampling import SamplingParams
from edgespec.runtime.samplers.tli import tli_greedy

# A response's JSON layout: whitespace as the model writes it, on one line or pretty-printed, and no
# more (as llama.cpp's JSON grammars): nothing, one space, or a line break and an indent of at most
# MAX_JSON_INDENT spaces or tabs, between two tokens of the JSON. So no answer runs on in whitespace, and
# a forbidden token cannot turn into a run of spaces. A fixed layout forces more tokens (free drafts),
# but a model that pretty-prints (Qwen2.5-Coder) then answers `{}` where every key is optional
# (docs/structured-output.md). A schema may ask for its own layout (LAYOUT_KEYS). Tool calls keep the
# fixed one (TOOL_CALL_JSON): models write them on one line.
MAX_JSON_INDENT = 40
JSON_OPTIONS = {"whitespace_pattern": f"(?:[ ]|\\r?\\n[ \\t]{{0,{MAX_JSON_INDENT}}})?"}
TOOL_CALL_JSON = {"item_separator": ", ", "key_separator": ": ", "whitespace_flexible": False}
LAYOUT_KEYS = ("item_separator", "key_separator", "whitespace_flexible", "whitespace_pattern")
RESPONSE_FORMAT_TYPES = ("text", "json_object", "json_schema", "regex", "grammar")
INSTALL = "pip install 'edgespec[serve]' (or 'edgespec[grammar]' for the library alone)"
MAX_ERROR = 300         # characters of an llguidance message kept (some run to thousands, over many lines)


def _llguidance():
    try:
        import llguidance
    except ImportError:
        raise GenerationError(f"structured output needs llguidance: {INSTALL}") from None
    return llguidance


@dataclass(frozen=True)
class Constraint:
    """A checked constraint: its kind (json_schema, json_object, regex, grammar), llguidance grammar,
    and one line per thing the schema says that the grammar leaves out (an unknown format)."""
    kind: str
    grammar: str
    notes: tuple[str, ...] = ()


def constraint_from(response_format=None, json_schema=None, regex=None, grammar=None) -> Constraint | None:
    """The one constraint named by generate()'s arguments (at most one of them), not yet compiled.

    response_format: {"type": "json_object"} | {"type": "json_schema", "json_schema": {"schema": {...}}}
    (OpenAI's shape; a bare {"type": "json_schema", "schema": {...}} too) | {"type": "regex", "regex": ..}
    | {"type": "grammar", "grammar": <Lark>} | {"type": "text"} (no constraint). json_schema: a dict or
    its JSON text; regex: a pattern the whole output matches; grammar: Lark text (llguidance's dialect)."""
    given = [n for n, v in (("response_format", response_format), ("json_schema", json_schema), ("regex", regex),
                            ("grammar", grammar)) if v is not None]
    if len(given) > 1:
        raise GenerationError(f"give one of response_format, json_schema, regex, grammar (got {', '.join(given)})")
    if not given or response_format == {"type": "text"}:
        return None                     # unconstrained: llguidance is not needed
    llg = _llguidance()
    M = llg.LLMatcher
    if response_format is not None:
        if not isinstance(response_format, dict) or "type" not in response_format:
            raise GenerationError("response_format must be an object with a 'type'")
        kind = response_format["type"]
        if kind == "text":
            return None
        if kind == "json_object":
            return Constraint("json_object", M.grammar_from_json_schema({"type": "object"}, overrides=JSON_OPTIONS))
        if kind == "json_schema":
            spec = response_format.get("json_schema", response_format)
            if not isinstance(spec, dict):
                raise GenerationError("response_format.json_schema must be an object")
            schema = spec.get("schema", {} if "json_schema" in response_format else None)
            if schema is None:
                raise GenerationError("response_format.json_schema.schema is missing")
            return constraint_from(json_schema=schema)
        if kind in ("regex", "grammar"):
            value = response_format.get(kind)
            if not isinstance(value, str):
                raise GenerationError(f"response_format.{kind} must be a string")
            return constraint_from(**{kind: value})
        raise GenerationError(f"response_format.type must be one of {', '.join(RESPONSE_FORMAT_TYPES)}, got {kind!r}")
    if json_schema is not None:
        if isinstance(json_schema, str):
            try:
                json_schema = jsonio.loads(json_schema)
            except ValueError as e:
                raise GenerationError(f"json_schema is not valid JSON: {e}") from None
        if not isinstance(json_schema, (dict, bool)):
            raise GenerationError(f"json_schema must be a JSON object, got {type(json_schema).__name__}")
        return _schema_constraint(M, json_schema)
    if regex is not None:
        if not isinstance(regex, str):
            raise GenerationError("regex must be a string")
        return Constraint("regex", M.grammar_from_regex(regex))
    if grammar is not None:
        if not isinstance(grammar, str) or not grammar.strip():
            raise GenerationError("grammar must be a non-empty Lark grammar string")
        return Constraint("grammar", M.grammar_from_lark(grammar))
    return None


def _schema_constraint(M, schema) -> Constraint:
    """A JSON schema's grammar. An unknown `format` is left out (JSON Schema's annotation), with a note;
    anything else llguidance refuses is refused, naming the "x-guidance" option that would approximate it."""
    guidance = schema.get("x-guidance") if isinstance(schema, dict) else None
    own = isinstance(guidance, dict) and any(k in guidance for k in LAYOUT_KEYS)
    layout = {} if own else JSON_OPTIONS          # a layout the schema asks for is its own
    try:
        g = M.grammar_from_json_schema(schema, overrides=layout)
    except (ValueError, TypeError) as e:
        raise GenerationError(f"json_schema: {_one_line(e)}") from None
    err = M.validate_grammar(g)
    if not err:
        return Constraint("json_schema", g)
    if err.startswith("Unknown format"):
        lenient = M.grammar_from_json_schema(schema, overrides=dict(layout, lenient=True))
        failed, warnings = M.validate_grammar_with_warnings(lenient)
        others = [w for w in warnings if not w.startswith("Unknown format")]
        if not failed and not others:
            names = ", ".join(w.split(":", 1)[1].strip() for w in warnings)
            return Constraint("json_schema", lenient, notes=(f"json_schema: format {names} not checked (an annotation)",))
        err = warnings[0] if failed else others[0]
    hint = next((f"; {h}" for k, h in _HINTS.items() if k in err), "")
    if hint:       # llguidance's own advice names the option but not where it goes: the hint says that
        err = err.replace(". Enable 'coerce_one_of' option to approximate oneOf with anyOf", "")
    raise GenerationError(f"json schema is not supported or invalid: {_one_line(err)}{hint}")


# what a refused schema can say to be compiled approximately (llguidance's options, read from the schema)
_LENIENT = ('add "x-guidance": {"lenient": true} to the schema to ignore the keys llguidance does not implement '
            '(the output may then break them)')
_HINTS = {"oneOf": 'add "x-guidance": {"coerce_one_of": true} to the schema to take oneOf as anyOf',
          "Unimplemented": _LENIENT,
          "min/maxProperties": _LENIENT.replace("the keys", "min/maxProperties and the keys")}


def _one_line(e) -> str:
    """llguidance's message on one line, cut to MAX_ERROR characters."""
    lines = [ln.strip() for ln in str(e).strip().splitlines() if ln.strip()]
    text = " ".join(lines) if lines else type(e).__name__
    return text if len(text) <= MAX_ERROR else text[:MAX_ERROR - 3] + "..."


class GrammarTokenizer:
    """The target's vocabulary for llguidance (built once per decoder: ~2 s for 152k tokens)."""

    def __init__(self, tokenizer, vocab_width: int, eos_ids):
        llg = _llguidance()
        self.width = int(vocab_width)
        self.eos_ids = [int(i) for i in eos_ids]
        if not self.eos_ids:
            raise GenerationError("structured output needs the target's end-of-sequence token (the bundle has none)")
        self.ll = llg.LLTokenizer(tokenizer.to_str(), n_vocab=self.width, eos_token=self.eos_ids)

    def check(self, constraint: Constraint) -> None:
        """Compile the grammar against the vocabulary; a one-line GenerationError if it cannot be."""
        err = _llguidance().LLMatcher.validate_grammar(constraint.grammar, self.ll)
        if err:
            raise GenerationError(f"{constraint.kind.replace('_', ' ')} is not supported or invalid: {_one_line(err)}")

    def start(self, constraint: Constraint) -> "GrammarState":
        """A matcher at the output's start; a constraint that admits no output at all (a schema that only
        refers to itself: llguidance compiles it, then allows nothing but the end) is refused here."""
        self.check(constraint)
        state = GrammarState(self, constraint)
        state.allowed()
        if state.matcher.is_error():
            stop = re.search(r"Stop: (\w+)", state.matcher.get_error() or "")
            raise GenerationError(f"{constraint.kind.replace('_', ' ')} admits no output"
                                  f"{f' (llguidance: {stop.group(1)})' if stop else ''}: it allows no first token")
        return state


def start_constraint(bundle, holder, response_format=None, json_schema=None, regex=None,
                     grammar=None) -> "GrammarState | None":
    """A fresh matcher for one generation's constraint (None: unconstrained). The target's vocabulary
    for llguidance is built at the first constrained call and kept in `holder.grammar_tokenizer`
    (the decoder's state shared with its variants)."""
    constraint = constraint_from(response_format, json_schema, regex, grammar)
    if constraint is None:
        return None
    if holder.grammar_tokenizer is None:
        t = bundle.target
        holder.grammar_tokenizer = GrammarTokenizer(t.tokenizer, t.vocab_size, t.eos_ids)
    return holder.grammar_tokenizer.start(constraint)


class GrammarState:
    """One generation's matcher, in step with the rounds (module docstring)."""

    def __init__(self, tok: GrammarTokenizer, constraint: Constraint):
        llg = _llguidance()
        self.matcher = llg.LLMatcher(tok.ll, constraint.grammar, log_level=0)   # the committed tokens
        if self.matcher.is_error():
            raise GenerationError(f"{constraint.kind}: {_one_line(self.matcher.get_error())}")
        self.notes = constraint.notes
        self.width = tok.width
        self.eos_ids = frozenset(tok.eos_ids)
        self.words = (self.width + 31) // 32
        self.work = None                  # a copy of `matcher` with the round's drafts consumed (None: none yet)
        self.drafts: list[int] = []       # drafts consumed on top of the committed tokens (by `work`)
        self.masks: list[np.ndarray] = []  # masks[j]: allowed after the committed tokens + j drafts
        self.mask_ms = 0.0
        self.mask_count = 0

    @property
    def pending(self) -> int:
        return len(self.drafts)

    # -- masks
    def allowed(self) -> np.ndarray:
        """bool [V]: the tokens the grammar allows next (after the pending drafts)."""
        if len(self.masks) > self.pending:
            return self.masks[self.pending]
        t = time.perf_counter()
        bits = np.zeros(self.words, dtype=np.int32)
        (self.work if self.drafts else self.matcher).unsafe_compute_mask_ptr(bits.ctypes.data, bits.nbytes)
        mask = np.unpackbits(bits.view(np.uint8), bitorder="little")[:self.width].view(bool)
        self.mask_ms += (time.perf_counter() - t) * 1e3
        self.mask_count += 1
        self.masks.append(mask)
        return mask

    def draft(self, token: int) -> bool:
        """Consume one draft if the grammar allows it (True); a forbidden one is not consumed (False),
        nor is an end-of-sequence token (generation ends there). A draft the mask allows but the
        matcher refuses is forbidden from then on in this row's mask: a rejected draft, not an error."""
        mask = self.allowed()
        if token in self.eos_ids or not mask[token]:
            return False
        if self.work is None:
            self.work = self.matcher.deep_copy()
        if self.work.try_consume_tokens([int(token)]) != 1:
            mask[token] = False           # (masks are this state's own arrays) verify cannot keep it now
            return False
        self.drafts.append(int(token))
        return True

    def block_masks(self, drafts) -> list[np.ndarray | None]:
        """Masks of the verify rows for `drafts` (len(drafts) + 1 rows); rows after the first forbidden
        draft are None (never used: that draft is rejected at the row before)."""
        rows: list[np.ndarray | None] = []
        for j, d in enumerate(drafts):
            rows.append(self.allowed() if j == self.pending else self.masks[j])
            if j >= self.pending and not self.draft(int(d)):     # forbidden, or the end
                return rows + [None] * (len(drafts) - j)
        rows.append(self.allowed())
        return rows

    def commit(self, n_acc: int, token: int) -> None:
        """Keep n_acc of the pending drafts, then consume the target's token (allowed by the row's mask,
        which verify applied). More accepted drafts than consumed ones, or an end-of-sequence token:
        generation ends there (nothing to consume). Nothing is rolled back: `matcher` consumes the
        kept tokens, or becomes the drafts' copy when it holds exactly them."""
        if n_acc > self.pending or token in self.eos_ids:
            return
        if not self.allowed_at(n_acc)[token]:
            raise GenerationError(f"grammar: the target's token {token} is not allowed (internal error)")
        if n_acc == self.pending and self.work is not None:
            matcher, ok = self.work, self.work.consume_token(int(token))
        else:
            matcher = self.matcher
            ok = matcher.consume_tokens([*self.drafts[:n_acc], int(token)])
        if not ok:
            raise GenerationError(f"grammar matcher: {_one_line(matcher.get_error())}")
        self.matcher, self.work, self.drafts, self.masks = matcher, None, [], []

    def allowed_at(self, j: int) -> np.ndarray:
        """The mask of row j (after j of the pending drafts), computed while drafting."""
        return self.masks[j] if j < len(self.masks) else self.allowed()

    # -- fast-forward
    def forced(self, limit: int) -> list[int]:
        """Up to `limit` tokens the grammar forces next (no choice left to the model)."""
        if limit <= 0 or self.pending:
            return []
        return [int(t) for t in self.matcher.compute_ff_tokens()[:limit]]

    @property
    def accepting(self) -> bool:
        return self.matcher.is_accepting()


def mask_logits(logits: np.ndarray, masks) -> np.ndarray:
    """A copy of logits [n, V] with each row's forbidden tokens at -inf (rows whose mask is None kept)."""
    out = np.array(logits, dtype=np.float32, copy=True)
    for row, mask in zip(out, masks):
        if mask is not None:
            np.copyto(row, -np.inf, where=~mask)
    return out


def masked_greedy(gen, kept_logits: np.ndarray, allowed: np.ndarray) -> int | None:
    """The strategy's temperature-0 draft among the tokens the grammar allows (None: none of the
    drafter's candidates is allowed). TLI-style strategies take the best allowed kept column; the
    others the argmax of their q at temperature 1 over the allowed tokens."""
    state = gen.prepared
    if gen.strategy.greedy is tli_greedy:          # tli, sd, ngram-tli: kept columns -> target ids
        index_map = state.index_map
        ok = state.valid & allowed[np.maximum(index_map, 0)]
        if not ok.any():
            return None
        col = int(np.argmax(np.where(ok, kept_logits, -np.inf)))
        return int(index_map[col])
    q = gen.strategy.distribution(state, kept_logits, SamplingParams(temperature=1.0), gen.work[0])
    return masked_argmax(q, allowed)


def masked_argmax(q: np.ndarray, allowed: np.ndarray) -> int | None:
    q = np.where(allowed[:q.shape[0]], q, 0.0)
    i = int(np.argmax(q))
    return i if q[i] > 0 else None


def mask_distribution(q: np.ndarray, allowed: np.ndarray) -> np.ndarray | None:
    """q (in place) restricted to the allowed tokens and renormalised; None if no mass is left (then
    nothing is drafted: a decision that depends on q and the grammar only, not on a draw)."""
    np.copyto(q, 0.0, where=~allowed[:q.shape[0]])
    mass = q.sum()
    if not mass > 0.0:
        return None
    q /= mass
    return q
