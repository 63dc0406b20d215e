"""Model-generated calibration text (VocabTrim §3: target-generated, or drafter-generated as ablation).

The model completes each prompt (the chat template wraps it for instruct models), greedy or sampled
with a per-prompt seed (seed + prompt index); only generated tokens are counted (the final EOS
included when the model emits it). A global `max_tokens` budget stops generation (the last prompt
is cut short) so a calibration on a 2-core CPU finishes in minutes; a progress bar shows tokens and ETA.

Two engines:
  - `BundleGenerator`: the bundle's ONNX target through the runtime decoder: no torch needed (the int4
    Qwen2.5-Coder-1.5B graph runs at 11-17 tok/s on 2 cores, torch fp32 at about 1.2). With a
    same-tokenizer drafter it decodes speculatively (`tli`, draft length 3: lossless, so the text has the
    target's own distribution); otherwise, and in a target-only bundle (`edgespec calibrate
    --target-bundle`, the target exported before the drafter's vocabulary exists), `ar`. The bundle's drafter
    graph has a pruned head, so drafter-generated text through a bundle is only possible when the
    drafter *is* the target model (e.g. smollm-self).
  - `TorchGenerator`: transformers + torch (1 thread) from an HF model directory.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tqdm import tqdm

from edgespec.calibrate.jsonl import jsonl_records
from edgespec.errors import CalibrationError
from edgespec.runtime.bundle.chat import as_messages, render_chat
from edgespec.runtime.api.decoder import SpeculativeDecoder


@dataclass
class Generation:
    prompt_id: str
    prompt_text: str          # the prompt as the model saw it (chat template applied)
    prompt_ids: np.ndarray    # int64
    ids: np.ndarray           # int64, generated tokens only
    text: str                 # generated text


class _Budget:
    """Global token budget + progress bar shared by the prompts of one generation run."""

    def __init__(self, max_tokens: int, desc: str, progress: bool):
        self.max_tokens = max_tokens
        self.used = 0
        self.bar = tqdm(total=max_tokens, desc=desc, unit="tok", disable=not progress, leave=False, mininterval=1.0)

    @property
    def left(self) -> int:
        return max(self.max_tokens - self.used, 0)

    def add(self, n: int) -> None:
        n = min(n, self.left)
        self.used += n
        self.bar.update(n)


class TorchGenerator:
    def __init__(self, hf_dir: Path, chat: bool | None = None):
        try:
            import torch  # lazy: the [export] extra; a calibration from a bundle needs no torch
            from transformers import AutoModelForCausalLM, AutoTokenizer  # lazy: [export] extra
        except ImportError as exc:
            raise CalibrationError(f"generating without a bundle needs torch + transformers "
                                   f"(pip install 'edgespec[export]'), or pass --bundle: {exc}") from None
        torch.set_num_threads(1)          # 2 threads are pathological on these VMs (docs/facts.md)
        self.torch = torch
        # transformers 4.57.6 warns of an "incorrect regex pattern" for any >100k-vocab tokenizer saved by
        # 4.57.3+; Qwen2's pattern is right (its "fix" changed 6 of 9 texts), and the default equals tokenizer.json
        self.tok = AutoTokenizer.from_pretrained(str(hf_dir), fix_mistral_regex=False)
        self.model = AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32).eval()
        self.chat = bool(self.tok.chat_template) if chat is None else chat
        if self.chat and not self.tok.chat_template:
            raise CalibrationError(f"{hf_dir}: --chat on, but the model has no chat template")
        gc = self.model.generation_config
        eos = gc.eos_token_id if gc.eos_token_id is not None else self.tok.eos_token_id
        self.eos = [eos] if isinstance(eos, int) else list(eos or [])

    def prompt_ids(self, text: str) -> tuple[str, np.ndarray]:
        if self.chat:
            rendered = self.tok.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                                    add_generation_prompt=True)
            ids = self.tok(rendered, add_special_tokens=False)["input_ids"]
        else:
            rendered = text
            ids = self.tok(text)["input_ids"]
        return rendered, np.asarray(ids, dtype=np.int64)

    def generate(self, text: str, max_new: int, temperature: float, top_p: float | None, seed: int,
                 budget: _Budget) -> Generation:
        from transformers import StoppingCriteria, StoppingCriteriaList  # lazy: [export] extra

        torch = self.torch
        rendered, ids = self.prompt_ids(text)

        class Tick(StoppingCriteria):
            def __call__(self, input_ids, scores, **kw):
                budget.add(1)
                return torch.full((input_ids.shape[0],), budget.left <= 0, dtype=torch.bool)

        torch.manual_seed(seed)
        kwargs = dict(max_new_tokens=max_new, eos_token_id=self.eos, pad_token_id=self.eos[0] if self.eos else None,
                      stopping_criteria=StoppingCriteriaList([Tick()]))
        if temperature > 0:
            kwargs.update(do_sample=True, temperature=temperature, top_k=0, top_p=top_p or 1.0)
        else:
            kwargs.update(do_sample=False, temperature=None, top_k=None, top_p=None)
        with torch.no_grad():
            out = self.model.generate(torch.as_tensor(ids)[None], attention_mask=torch.ones(1, ids.size, dtype=torch.long),
                                      **kwargs)
        gen = out[0, ids.size:].numpy().astype(np.int64)
        gen = _cut_at_eos(gen, self.eos)
        return Generation("", rendered, ids, gen, self.tok.decode(gen.tolist(), skip_special_tokens=False))


class BundleGenerator:
    def __init__(self, bundle, ep: str = "cpu", threads: int | None = 1, chat: bool | None = None):
        self.bundle = bundle
        speculate = bundle.has_drafter and bundle.same_tokenizer
        self.dec = SpeculativeDecoder(bundle, strategy="tli" if speculate else "ar", draft_length=3, ep=ep,
                                      threads=threads)
        self.tok = bundle.target.tokenizer
        self.chat = bool(bundle.target.chat_template) if chat is None else chat
        if self.chat and not bundle.target.chat_template:
            raise CalibrationError("--chat on, but the bundle's target has no chat template")
        self.eos = bundle.target.eos_ids

    def _token(self, i: int | None) -> str | None:
        return None if i is None else self.tok.id_to_token(int(i))

    def prompt_ids(self, text: str) -> tuple[str, np.ndarray]:
        if self.chat:
            rendered = render_chat(self.bundle.target.chat_template, as_messages(text),
                                   bos_token=self._token(self.bundle.target.bos_id) or "",
                                   eos_token=self._token((self.eos or [None])[0]) or "")
            ids = self.tok.encode(rendered, add_special_tokens=False).ids
        else:
            rendered = text
            ids = self.tok.encode(text, add_special_tokens=True).ids
        return rendered, np.asarray(ids, dtype=np.int64)

    def generate(self, text: str, max_new: int, temperature: float, top_p: float | None, seed: int,
                 budget: _Budget) -> Generation:
        rendered, _ = self.prompt_ids(text)
        res = self.dec.generate(text, max_new_tokens=max_new, temperature=temperature, top_p=top_p, seed=seed,
                                chat=self.chat)
        ids = np.asarray(res.prompt_token_ids, dtype=np.int64)     # exactly what the target saw
        gen = _cut_at_eos(np.asarray(res.token_ids, dtype=np.int64), self.eos)
        budget.add(int(gen.size))
        return Generation("", rendered, ids, gen, self.tok.decode(gen.tolist(), skip_special_tokens=False))


def _cut_at_eos(ids: np.ndarray, eos: list[int]) -> np.ndarray:
    """Generated ids up to and including the first EOS (padding after it is not generated text)."""
    if eos:
        hits = np.flatnonzero(np.isin(ids, eos))
        if hits.size:
            return ids[: hits[0] + 1]
    return ids


def generate_corpus(generator, prompts, max_tokens: int, max_new_tokens: int = 256, temperature: float = 0.7,
                    top_p: float | None = None, seed: int = 0, desc: str = "generating",
                    progress: bool = True) -> list[Generation]:
    """Complete `prompts` in order until `max_tokens` generated tokens (counted tokens only)."""
    if max_tokens < 1:
        raise CalibrationError(f"--max-tokens must be at least 1, got {max_tokens}")
    if max_new_tokens < 1:
        raise CalibrationError(f"--max-new-tokens must be at least 1, got {max_new_tokens}")
    if temperature < 0:
        raise CalibrationError(f"--temperature must be >= 0, got {temperature}")
    if not prompts:
        raise CalibrationError("no prompts to generate from (empty prompt set or split)")
    budget = _Budget(max_tokens, desc, progress)
    out: list[Generation] = []
    try:
        for i, prompt in enumerate(prompts):
            if budget.left <= 0:
                break
            g = generator.generate(prompt.text, min(max_new_tokens, budget.left), temperature, top_p, seed + i, budget)
            g.prompt_id = prompt.id
            out.append(g)
    finally:
        budget.bar.close()
    if sum(g.ids.size for g in out) == 0:
        raise CalibrationError("the model generated no tokens for any prompt")
    return out


def save_generations(path: Path, gens: dict, hashes: dict) -> None:
    """Generations as jsonl, one record per prompt: source, id, prompt_text, prompt_ids, text, token_ids,
    vocab_hash (of the generating model's tokenizer). `--generated` reads them back."""
    with open(path, "w", encoding="utf-8") as f:
        for source, items in gens.items():
            for g in items:
                f.write(json.dumps({"source": source, "id": g.prompt_id, "prompt_text": g.prompt_text,
                                    "prompt_ids": g.prompt_ids.tolist(), "text": g.text, "token_ids": g.ids.tolist(),
                                    "vocab_hash": hashes[source]}, ensure_ascii=False) + "\n")


def load_generations(paths: list[Path], source: str, vocab_hash: str) -> list[Generation]:
    """The `source` ("target"/"drafter") records of saved generation files; refuses records made with
    another tokenizer."""
    out: list[Generation] = []
    for path in paths:
        with open(path, encoding="utf-8") as f:
            for lineno, rec in jsonl_records(f, path):
                try:
                    if rec.get("source") != source:
                        continue
                    g = Generation(str(rec["id"]), rec["prompt_text"], np.asarray(rec["prompt_ids"], dtype=np.int64),
                                   np.asarray(rec["token_ids"], dtype=np.int64), rec["text"])
                except (ValueError, KeyError, TypeError, AttributeError):
                    raise CalibrationError(f"{path}:{lineno}: not a generation record (write them with --save-text)") \
                        from None
                if rec.get("vocab_hash") != vocab_hash:
                    raise CalibrationError(f"{path}:{lineno}: generated with another {source} tokenizer")
                out.append(g)
    if not out or sum(g.ids.size for g in out) == 0:
        raise CalibrationError(f"--generated: no {source} generations in {', '.join(map(str, paths))}")
    return out
