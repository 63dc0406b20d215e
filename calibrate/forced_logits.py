"""Teacher-forced passes: target p and drafter q' at the same positions, for the affinity M and a*.
(The mechanism: aligned positions, both models' logits, p and q' per position; forced_priors.py picks the
sequences and builds M and a* from what a pass yields.)

A calibration sequence is run through both models (with the KV cache, in windows of `window` tokens,
so the logits held at once are [window, V]) and every position that predicts a calibration token
yields p = softmax(target logits / T) over the target vocabulary and q' = the drafter's distribution
over the kept columns, pruned and renormalised (TLI: columns without a target id get zero).

Same tokenizer: positions are token indices, identical for both models. Heterogeneous pair: both
tokenizers encode the same text and a position is used where both have a token boundary at the same
byte offset (token bytes from runtime/bundle/vocab.py's tables); the target's p and the drafter's q' then
both describe "the next token starting here". Sequences whose token bytes do not add up to the text
are skipped and counted.

Logits come from the bundle's ONNX graphs (torch-free, `OrtLogits`) or from torch (`TorchLogits`).
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tqdm import tqdm

from edgespec.calibrate.counts import special_affixes
from edgespec.errors import CalibrationError
from edgespec.runtime.engine.kv import ModelRunner
from edgespec.runtime.samplers.sampling import softmax
from edgespec.runtime.engine.sessions import create_session
from edgespec.runtime.samplers.tli import tli_rows
from edgespec.runtime.bundle.vocab import SPECIAL_PREFIX, as_tokenizer, token_table


@dataclass
class TFSequence:
    target_ids: np.ndarray          # int64: what the target sees
    drafter_ids: np.ndarray         # int64: what the drafter sees
    pairs: np.ndarray               # int64 [n, 2]: (target row, drafter row) of aligned predicting positions


def same_tokenizer_sequence(ids: np.ndarray, start: int, max_len: int | None = None) -> TFSequence | None:
    """Positions predicting tokens ids[start:], ids[:max_len] only."""
    ids = np.asarray(ids, dtype=np.int64)[:max_len]
    rows = np.arange(max(start, 1) - 1, ids.size - 1, dtype=np.int64)
    if rows.size == 0:
        return None
    return TFSequence(ids, ids, np.stack([rows, rows], axis=1))


class ByteOffsets:
    """Byte start of every token of an encoding, from the tokenizer's token table."""

    def __init__(self, tokenizer):
        self.tok = as_tokenizer(tokenizer)
        table = token_table(self.tok)
        self.pieces = [k[len(SPECIAL_PREFIX):] if k and k.startswith(SPECIAL_PREFIX) else (k or b"")
                       for k in table.keys]
        self.lengths = np.array([len(k) for k in self.pieces], dtype=np.int64)
        self.n_prefix = len(special_affixes(self.tok)[0])

    def encode(self, text: str) -> tuple[np.ndarray, np.ndarray] | None:
        """(ids, byte start of each token) or None when the token bytes do not reproduce the text."""
        ids = np.asarray(self.tok.encode(text, add_special_tokens=True).ids, dtype=np.int64)
        lens = self.lengths[np.minimum(ids, self.lengths.size - 1)].copy()
        lens[: self.n_prefix] = 0                 # BOS added by the post-processor: not in the text
        n_text = len(text.encode("utf-8"))
        total = int(lens.sum())
        shift = total - n_text                    # SentencePiece may prepend one space (▁)
        if shift not in (0, 1):
            return None
        starts = np.concatenate([[0], np.cumsum(lens)[:-1]]) - shift
        return ids, starts

    def text_of(self, ids: np.ndarray, prompt: bytes) -> tuple[str, np.ndarray, np.ndarray] | None:
        """Decode known ids to (text, ids, starts): a leading BOS that is not in `prompt` counts as zero
        bytes, and the text stops before the first byte that is not valid UTF-8 (a character split
        across tokens at the end), dropping the tokens beyond it."""
        ids = np.asarray(ids, dtype=np.int64)
        pieces = [self.pieces[i] if i < len(self.pieces) else b"" for i in ids]
        lens = np.array([len(p) for p in pieces], dtype=np.int64)
        blob = b"".join(pieces)
        if not blob.startswith(prompt):
            if ids.size and blob[lens[0]:].startswith(prompt):
                blob, lens[0] = blob[lens[0]:], 0
            else:
                return None
        try:
            text = blob.decode("utf-8")
        except UnicodeDecodeError as exc:
            text = blob[: exc.start].decode("utf-8", errors="ignore")
        ends = np.cumsum(lens)
        keep = int(np.searchsorted(ends, len(text.encode("utf-8")), side="right"))
        return text, ids[:keep], (ends - lens)[:keep]


def _pair_boundaries(t_starts: np.ndarray, d_starts: np.ndarray, start_byte: int) -> np.ndarray | None:
    """(target row, drafter row) where both next tokens start at the same byte offset >= start_byte."""
    def first_index(starts):
        idx = np.arange(1, starts.size)            # token i is predicted at row i - 1
        ok = (starts[1:] >= max(start_byte, 1)) & (np.diff(starts) > 0)   # first token at each offset
        return dict(zip(starts[1:][ok].tolist(), (idx[ok] - 1).tolist()))

    ti, di = first_index(t_starts), first_index(d_starts)
    common = sorted(set(ti) & set(di))
    if not common:
        return None
    return np.array([[ti[b], di[b]] for b in common], dtype=np.int64)


def aligned_sequence(text: str, start_byte: int, t_off: ByteOffsets, d_off: ByteOffsets,
                     max_len: int | None = None) -> TFSequence | None:
    """Both tokenizers encode `text`; positions where both start a token at the same byte offset."""
    t = t_off.encode(text)
    d = d_off.encode(text)
    if t is None or d is None:
        return None
    t_ids, t_starts = t[0][:max_len], t[1][:max_len]
    d_ids, d_starts = d[0][:max_len], d[1][:max_len]
    pairs = _pair_boundaries(t_starts, d_starts, start_byte)
    return None if pairs is None else TFSequence(t_ids, d_ids, pairs)


def aligned_generation(ids: np.ndarray, prompt_text: str, own: ByteOffsets, other: ByteOffsets,
                       own_is_target: bool, max_len: int | None = None) -> TFSequence | None:
    """A generated sequence (prompt + generated ids of the generating model, `own`) against the other
    tokenizer's encoding of the same text; positions in the generated part only."""
    prompt = prompt_text.encode("utf-8")
    decoded = own.text_of(np.asarray(ids)[:max_len], prompt)
    if decoded is None:
        return None
    text, own_ids, own_starts = decoded
    enc = other.encode(text)
    if enc is None:
        return None
    other_ids, other_starts = enc[0][:max_len], enc[1][:max_len]
    if own_is_target:
        pairs = _pair_boundaries(own_starts, other_starts, len(prompt))
        return None if pairs is None else TFSequence(own_ids, other_ids, pairs)
    pairs = _pair_boundaries(other_starts, own_starts, len(prompt))
    return None if pairs is None else TFSequence(other_ids, own_ids, pairs)


def text_sequences(texts, max_len: int | None, target_tok, drafter_tok=None):
    """TFSequences (or None where unaligned) of whole texts: with one tokenizer for both models
    (`drafter_tok` None) every position after the first token; else the positions where both
    tokenizers start a token at the same byte."""
    offsets = None if drafter_tok is None else (ByteOffsets(target_tok), ByteOffsets(drafter_tok))
    for text in texts:
        if offsets is None:
            ids = np.asarray(target_tok.encode(text, add_special_tokens=True).ids, dtype=np.int64)
            yield same_tokenizer_sequence(ids, 1, max_len)
        else:
            yield aligned_sequence(text, 0, *offsets, max_len=max_len)


# --------------------------------------------------------------------------- logit sources

class OrtLogits:
    """Logits at chosen rows of a sequence from an ONNX causal LM (runtime ModelRunner, KV cache)."""

    def __init__(self, onnx_path: Path, cols: np.ndarray | None = None, ep: str = "cpu", threads: int | None = 1,
                 window: int = 128, role: str = "model"):
        sess, self.session_info = create_session(onnx_path, ep=ep, threads=threads, role=role)
        self.runner = ModelRunner(sess, role=role)
        self.cols = None if cols is None else np.asarray(cols, dtype=np.int64)
        self.window = window

    def __call__(self, ids: np.ndarray, rows: np.ndarray) -> np.ndarray:
        self.runner.reset()
        return _windowed(lambda chunk: self.runner.forward(chunk), ids, rows, self.window, self.cols)


class TorchLogits:
    """The same from a transformers model directory (torch, 1 thread)."""

    def __init__(self, hf_dir: Path, cols: np.ndarray | None = None, window: int = 128):
        try:                    # lazy: torch and transformers are optional (edgespec[export]) and heavy
            import torch  # lazy: the [export] extra
            from transformers import AutoModelForCausalLM  # lazy: the [export] extra
        except ImportError as exc:
            raise CalibrationError(f"teacher-forced passes without a bundle need torch + transformers "
                                   f"(pip install 'edgespec[export]'), or pass --bundle: {exc}") from None
        torch.set_num_threads(1)
        self.torch = torch
        self.model = AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32).eval()
        self.cols = None if cols is None else torch.as_tensor(np.asarray(cols, dtype=np.int64))
        self.window = window
        self.past = None

    def _forward(self, chunk: np.ndarray) -> np.ndarray:
        torch = self.torch
        with torch.no_grad():
            out = self.model(input_ids=torch.as_tensor(chunk, dtype=torch.long)[None], past_key_values=self.past,
                             use_cache=True)
        self.past = out.past_key_values
        return out.logits[0].float().numpy()

    def __call__(self, ids: np.ndarray, rows: np.ndarray) -> np.ndarray:
        self.past = None
        cols = None if self.cols is None else self.cols.numpy()
        return _windowed(self._forward, ids, rows, self.window, cols)


def _windowed(forward, ids: np.ndarray, rows: np.ndarray, window: int, cols: np.ndarray | None) -> np.ndarray:
    """Run `forward` over ids in windows (the cache carries context) and gather the wanted rows."""
    ids = np.asarray(ids, dtype=np.int64)
    rows = np.asarray(rows, dtype=np.int64)
    last = int(rows.max()) + 1 if rows.size else 0
    parts = []
    for a in range(0, last, window):
        b = min(a + window, last)
        logits = forward(ids[a:b])
        sel = rows[(rows >= a) & (rows < b)] - a
        if sel.size:
            part = logits[sel]
            parts.append(np.array(part[:, cols] if cols is not None else part, dtype=np.float32))
    return np.concatenate(parts, axis=0)


# --------------------------------------------------------------------------- distributions
# p = runtime.sampling.softmax(target logits, T) and q' = runtime.tli.tli_rows(kept drafter logits,
# index_map, T), both in float32 (the logits' precision).

@dataclass
class PassStats:
    sequences: int = 0
    positions: int = 0
    skipped_sequences: int = 0
    heldout_positions: int = 0
    blocks: int = 0


BLOCK = 32


def run_pass(sequences, target_fn, drafter_fn, index_map: np.ndarray, temperature: float, consumers: list,
             max_positions: int, heldout=None, heldout_every: int = 5, every: list = (), progress: bool = True,
             block_offset: int = 0) -> PassStats:
    """Feed aligned (p, q') rows, in blocks of 32 positions, to each consumer's `add(p, q_cols)`.
    With `heldout`, every `heldout_every`-th block goes to `heldout(p, q_cols)` instead of `consumers`;
    consumers in `every` get all blocks. `block_offset` continues the block count of an earlier pass."""
    if not temperature > 0:
        raise CalibrationError(f"teacher-forced priors need a temperature > 0, got {temperature}")
    stats = PassStats()
    block = block_offset
    bar = tqdm(total=max_positions, desc="teacher-forced positions", unit="pos", disable=not progress, leave=False,
               mininterval=1.0)
    try:
        for seq in sequences:
            if seq is None:
                stats.skipped_sequences += 1
                continue
            if stats.positions + stats.heldout_positions >= max_positions:
                break
            pairs = seq.pairs[: max_positions - stats.positions - stats.heldout_positions]
            p = softmax(target_fn(seq.target_ids, pairs[:, 0]), temperature)
            q = tli_rows(drafter_fn(seq.drafter_ids, pairs[:, 1]), index_map, temperature)
            ok = q.sum(axis=1) > 0
            p, q = p[ok], q[ok]
            for start in range(0, p.shape[0], BLOCK):      # bounded float64 temporaries downstream
                ps, qs = p[start:start + BLOCK], q[start:start + BLOCK]
                for c in every:
                    c.add(ps, qs)
                if heldout is not None and block % heldout_every == heldout_every - 1:
                    heldout(ps, qs)
                    stats.heldout_positions += int(ps.shape[0])
                else:
                    for c in consumers:
                        c.add(ps, qs)
                    stats.positions += int(ps.shape[0])
                block += 1
            stats.sequences += 1
            bar.update(int(p.shape[0]))
    finally:
        bar.close()
    stats.blocks = block
    if stats.skipped_sequences:
        print(f"edgespec: warning: {stats.skipped_sequences} sequence(s) could not be aligned and were skipped",
              file=sys.stderr)
    return stats


class AStarFeed:
    """Adapter: feeds (p on the drafter's support, q') to an AStarAccumulator."""

    def __init__(self, acc, index_map: np.ndarray):
        self.acc = acc
        self.has = np.asarray(index_map) >= 0
        # several kept columns may map to one target id: fold them so each target id appears once
        self.uniq, self.inv = np.unique(np.asarray(index_map)[self.has], return_inverse=True)
        self.folded = self.uniq.size != int(self.has.sum())

    def add(self, p: np.ndarray, q_cols: np.ndarray) -> None:
        q = q_cols[:, self.has].astype(np.float64)
        if self.folded:
            q_t = np.zeros((q.shape[0], self.uniq.size), dtype=np.float64)
            for j in range(q.shape[0]):
                q_t[j] = np.bincount(self.inv, weights=q[j], minlength=self.uniq.size)
            q = q_t
        else:
            q = q[:, np.argsort(self.inv)] if not np.all(np.diff(self.inv) > 0) else q
        self.acc.add(p[:, self.uniq], q, p.sum(axis=1, dtype=np.float64))
