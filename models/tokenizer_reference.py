"""Checking a converted tokenizer against llama.cpp's `llama-tokenize` on the same GGUF. Torch-free.

`compare(tokenizer, gguf, lines, binary)` tokenizes every line with both (no BOS, special tokens
parsed, as the runtime encodes rendered chat prompts) and counts lines whose ids agree token for
token, and lines where decode(encode(x)) != x. `find_llama_tokenize()` looks for the binary in
$EDGESPEC_LLAMA_TOKENIZE, then on PATH; without one the check is skipped (and recorded as such).
REFERENCE_LINES is the small corpus the pull-time check uses; benchmarks/tokenizer_reference.py
runs the full corpus (benchmarks/tokenizer_corpus.jsonl).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from tokenizers import Tokenizer

from edgespec.errors import ModelSourceError

ENV = "EDGESPEC_LLAMA_TOKENIZE"
TIMEOUT_S = 120

REFERENCE_LINES: tuple[str, ...] = (
    " the", "def fibonacci(n):", "The quick brown fox jumps over the lazy dog.",
    "def fibonacci(n):\n\tif n < 2:\n\t\treturn n\n\treturn fibonacci(n - 1) + fibonacci(n - 2)\n",
    "\t\t\t\t\tdeeply_indented_with_tabs = True", "\t \t mixed tabs and spaces \t",
    "if (a) {\n    if (b) {\n        if (c) {\n            return 42;\n        }\n    }\n}",
    "a  b   c    d     e      f       g        h", "trailing spaces   ", "\n\nleading newlines",
    "line one\nline two\r\nline three\rline four", "          ", "word\n\n\n\nword",
    "It's a dog's life; they're sure we'll see, I'd say they've won. IT'S LOUD! We'LL see.",
    "0 1 12 123 1234 12345 123456 1234567 3.14159265358979 -42 1e-10 0xDEADBEEF 1_000_000",
    "naïve café résumé façade jalapeño São Paulo Zürich Ærøskøbing Łódź Dvořák İstanbul",
    "Ελληνικά: Καλημέρα κόσμε. Русский: Съешь же ещё этих мягких французских булок.",
    "日本語の文章を正しく分割できるかどうかを確認します。", "中文测试：机器学习是人工智能的一个分支。",
    "한국어 문장도 확인합니다.", "Emoji: 😀😃 👍🏽 👨‍👩‍👧‍👦 🇯🇵 ❤️ ✨🚀🔥",
    "Math: ∀x∈ℝ, ∃y: x² + y² ≥ 2xy; ∑ i = n(n+1)/2",
    "<html><body><div class=\"main\"><p>Hello &amp; welcome&nbsp;!</p></div></body></html>",
    "<table><tr><th>Name</th><td>Value</td></tr></table> <h1>Title</h1> <b>bold</b>",
    "# Heading\n\n- item **bold** and _italic_\n- [link](https://example.com/a?b=c&d=e#f)\n",
    "{\"name\": \"edgespec\", \"tags\": [\"llm\", \"onnx\"], \"nested\": {\"a\": null, \"c\": 1.5e3}}",
    "SELECT id, name FROM users WHERE age >= 18 ORDER BY name DESC LIMIT 10;",
    "    @property\n    def name(self) -> str:\n        \"\"\"The name.\"\"\"\n        return self._name\n",
    "C:\\Users\\name\\Documents\\file.txt \\n \\t", "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    "Zero\u200bwidth\u200cjoiners\u200d and e\u0301 a\u0308 combining", "ｈｅｌｌｏ　ｗｏｒｌｄ ﬁ ｶﾀｶﾅ",
    "<start_of_turn>user\nHello!<end_of_turn>\n<start_of_turn>model\n",
    "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n", "x\u00a0y\u3000z", "end with newline\n",
)


@dataclass
class Comparison:
    lines: int = 0
    identical: int = 0
    roundtrip: int = 0                      # lines where decode(encode(x)) == x
    mismatches: list = field(default_factory=list)    # (line index, ours, llama.cpp), first few
    roundtrip_failures: list = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.identical == self.lines and self.roundtrip == self.lines

    def summary(self) -> dict:
        return {"lines": self.lines, "identical": self.identical, "roundtrip": self.roundtrip,
                "mismatched_lines": [m[0] for m in self.mismatches][:20],
                "roundtrip_failed_lines": self.roundtrip_failures[:20]}


def find_llama_tokenize(explicit: str | Path | None = None) -> Path | None:
    for cand in (explicit, os.environ.get(ENV), shutil.which("llama-tokenize")):
        if cand and Path(cand).is_file() and os.access(cand, os.X_OK):
            return Path(cand)
    return None


def llama_version(binary: Path) -> str:
    proc = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=TIMEOUT_S)
    line = (proc.stdout + proc.stderr).strip().splitlines()
    return line[0][:80] if line else "unknown"


def llama_ids_with_bos(binary: Path, gguf: Path, text: str) -> list[int]:
    """llama.cpp's ids for `text` with the BOS/EOS it adds by the GGUF's add_bos/add_eos."""
    return llama_ids(binary, gguf, text, add_special=True)


def llama_ids(binary: Path, gguf: Path, text: str, add_special: bool = False) -> list[int]:
    """llama.cpp's ids for `text` (no BOS, special tokens parsed, escapes not processed)."""
    with tempfile.NamedTemporaryFile("wb", suffix=".txt", delete=False) as fh:
        fh.write(text.encode("utf-8"))
        name = fh.name
    try:
        proc = subprocess.run([str(binary), "-m", str(gguf), "-f", name, "--ids", "--no-escape", "--log-disable",
                               *([] if add_special else ["--no-bos"])], capture_output=True, timeout=TIMEOUT_S)
    finally:
        os.unlink(name)
    out = proc.stdout.decode("utf-8", "replace").strip().splitlines()
    if proc.returncode != 0 or not out or not out[-1].startswith("["):
        err = proc.stderr.decode("utf-8", "replace").strip().splitlines()[-1:] or ["no output"]
        raise ModelSourceError(f"llama-tokenize failed on {gguf.name} (exit {proc.returncode}): {err[0][:160]}")
    return json.loads(out[-1])


def compare(tokenizer, gguf: Path, lines, binary: Path, keep: int = 10) -> Comparison:
    res = Comparison()
    for i, text in enumerate(lines):
        ours = tokenizer.encode(text, add_special_tokens=False).ids
        ref = llama_ids(binary, gguf, text)
        res.lines += 1
        if ours == ref:
            res.identical += 1
        elif len(res.mismatches) < keep:
            res.mismatches.append((i, ours, ref))
        if tokenizer.decode(ours, skip_special_tokens=False) == text:
            res.roundtrip += 1
        else:
            res.roundtrip_failures.append(i)
    return res


def load_corpus(path: Path) -> list[str]:
    """A corpus file: one JSON string per line (so tabs, \\r and trailing spaces survive)."""
    return [json.loads(ln) for ln in Path(path).read_text(encoding="utf-8").splitlines() if ln.strip()]


def reference_check(hf_dir: Path, gguf: Path, binary: Path | None = None) -> dict:
    """The pull-time check of hf_dir/tokenizer.json against llama.cpp on REFERENCE_LINES.

    Returns the record to store; raises ModelSourceError if any line differs. Without a
    llama-tokenize binary, returns {"skipped": ...}."""
    binary = find_llama_tokenize(binary)
    if binary is None:
        return {"skipped": f"no llama-tokenize (set ${ENV} or put it on PATH)"}
    tok = Tokenizer.from_file(str(Path(hf_dir) / "tokenizer.json"))
    res = compare(tok, Path(gguf), REFERENCE_LINES, binary)
    if not res.ok:
        first = res.mismatches[0][0] if res.mismatches else res.roundtrip_failures[0]
        raise ModelSourceError(f"tokenizer of {Path(gguf).name} differs from llama.cpp's on {res.lines - res.identical} "
                               f"of {res.lines} reference lines ({res.lines - res.roundtrip} fail decode(encode(x)) "
                               f"== x; first: line {first} {REFERENCE_LINES[first][:40]!r})")
    return {"llama_tokenize": str(binary), **res.summary()}
