"""The coding agent's sandbox for benchmarks/agent_loop.py: small Python projects held in memory, the
tools an agent gets over them (list_files, read_file, write_file, replace_in_file, run_tests), and the
tasks, split into calib (for tuning) and test (for reporting).

run_tests really runs the project's test_*.py files, in a fresh Python subprocess on a temporary copy,
with a tiny runner whose report looks like pytest's and holds nothing that varies between runs (no
timings, no paths): the same files always give the same text, so both servers of a run see the same
tool results for the same calls.
"""
from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

SYSTEM = ("You are a coding agent working in a small Python project, which you can only see and change through "
          "the tools. Work in steps, one tool call per step: first read the files you need (read_file), then write "
          "each file you change in full (write_file) or edit it (replace_in_file), then run the tests (run_tests). "
          "Never claim a change you have not made with a tool. When the tests pass, reply with a short summary of "
          "what you changed.")
FINISH_SYSTEM = SYSTEM.replace("reply with a short summary of what you changed", "call finish with a short summary "
                               "of what you changed")
FINISH = {"type": "function", "function": {"name": "finish", "description": "End the task with a short summary of "
          "what you changed.", "parameters": {"type": "object", "properties": {"summary": {"type": "string"}},
                                              "required": ["summary"], "additionalProperties": False}}}

TOOLS = [
    {"type": "function", "function": {"name": "list_files", "description": "List the project's files with their "
     "line counts.", "parameters": {"type": "object", "properties": {}, "additionalProperties": False}}},
    {"type": "function", "function": {"name": "read_file", "description": "Read a file of the project.",
     "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"],
                    "additionalProperties": False}}},
    {"type": "function", "function": {"name": "write_file", "description": "Write a file of the project (its "
     "whole new content).", "parameters": {"type": "object", "properties": {"path": {"type": "string"},
                                                                          "content": {"type": "string"}},
                                           "required": ["path", "content"], "additionalProperties": False}}},
    {"type": "function", "function": {"name": "replace_in_file", "description": "Replace the first occurrence of "
     "`old` by `new` in a file.", "parameters": {"type": "object", "properties": {
         "path": {"type": "string"}, "old": {"type": "string"}, "new": {"type": "string"}},
         "required": ["path", "old", "new"], "additionalProperties": False}}},
    {"type": "function", "function": {"name": "run_tests", "description": "Run the project's tests and show "
     "the report.", "parameters": {"type": "object", "properties": {}, "additionalProperties": False}}},
]

RUNNER = r'''
import glob, importlib, os, sys, traceback
sys.path.insert(0, os.getcwd())
sys.dont_write_bytecode = True
lines, failures, counts = [], [], {"passed": 0, "failed": 0, "error": 0}
def where(exc):
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if not f.filename == "<string>"]
    f = frames[-1] if frames else None
    return f"{os.path.basename(f.filename)}:{f.lineno}: {f.line}" if f else ""
for path in sorted(glob.glob("test_*.py")):
    try:
        mod = importlib.import_module(path[:-3])
    except BaseException as exc:
        counts["error"] += 1
        lines.append(f"{path} ERROR")
        failures.append((f"ERROR collecting {path}", exc))
        continue
    for name, fn in list(vars(mod).items()):
        if name.startswith("test_") and callable(fn):
            try:
                fn()
                counts["passed"] += 1
                lines.append(f"{path}::{name} PASSED")
            except BaseException as exc:
                counts["failed"] += 1
                lines.append(f"{path}::{name} FAILED")
                failures.append((f"{path}::{name}", exc))
print("=" * 29 + " test session starts " + "=" * 29)
print(f"collected {counts['passed'] + counts['failed']} items\n")
print("\n".join(lines))
if failures:
    print("\n" + "=" * 35 + " FAILURES " + "=" * 34)
for title, exc in failures:
    print(f"___ {title} ___")
    print(where(exc))
    print(f"E   {type(exc).__name__}: {exc}")
summary = ", ".join(f"{n} {k}" for k, n in counts.items() if n) or "no tests ran"
print("=" * 20 + f" {summary} " + "=" * 20)
'''


def run_tests(files: dict[str, str], timeout: float = 60.0) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        for name, text in files.items():
            (Path(tmp) / name).parent.mkdir(parents=True, exist_ok=True)
            (Path(tmp) / name).write_text(text)
        try:
            out = subprocess.run([sys.executable, "-I", "-c", RUNNER],
                                 cwd=tmp, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return f"run_tests: the tests did not finish in {timeout:g} s"
    text = (out.stdout + out.stderr[-2000:]).strip()
    return text.replace(tmp + "/", "").replace(tmp, ".")          # no temporary paths: the same every run


def call_tool(files: dict[str, str], name: str, arguments: str) -> str:
    """Run one tool call on `files` (changed in place); its result as the tool message's text."""
    try:
        args = json.loads(arguments or "{}")
    except ValueError:
        return "error: the arguments are not valid JSON"
    path = args.get("path") if isinstance(args, dict) else None
    if name == "list_files":
        return "\n".join(f"{p} ({len(t.splitlines())} lines)" for p, t in sorted(files.items()))
    if name == "run_tests":
        return run_tests(files)
    if name in ("read_file", "replace_in_file") and path not in files:
        return f"error: no such file: {path}"
    if name == "read_file":
        return files[path]
    if name == "write_file":
        if not isinstance(path, str) or not path or not isinstance(args.get("content"), str):
            return "error: write_file needs a path and a content string"
        parts = Path(path).parts
        if Path(path).is_absolute() or ".." in parts or not parts or path.endswith("/"):
            return f"error: {path!r} is not a file path inside the project"
        files[path] = args["content"] if args["content"].endswith("\n") else args["content"] + "\n"
        return f"wrote {path} ({len(files[path].splitlines())} lines)"
    if name == "replace_in_file":
        old, new = args.get("old"), args.get("new")
        if not isinstance(old, str) or not old or not isinstance(new, str):
            return "error: replace_in_file needs non-empty old and new strings"
        if old not in files[path]:
            return f"error: the old text does not occur in {path}"
        files[path] = files[path].replace(old, new, 1)
        return f"replaced 1 occurrence in {path}"
    return f"error: no such tool: {name}"


@dataclass(frozen=True)
class Task:
    id: str
    split: str
    prompt: str
    files: dict


STATS = '''"""Descriptive statistics for small samples of numbers."""
from __future__ import annotations

import math
from collections import Counter


def mean(data: list[float]) -> float:
    if not data:
        raise ValueError("mean of an empty sample")
    return sum(data) / len(data)


def median(data: list[float]) -> float:
    if not data:
        raise ValueError("median of an empty sample")
    ordered = sorted(data)
    n = len(ordered)
    mid = n // 2
    if n % 2 == 1:
        return ordered[mid]
    return ordered[mid]


def mode(data: list[float]) -> float:
    if not data:
        raise ValueError("mode of an empty sample")
    counts = Counter(data)
    best = max(counts.values())
    return min(x for x, c in counts.items() if c == best)


def variance(data: list[float], sample: bool = True) -> float:
    n = len(data)
    if n < 2 and sample:
        raise ValueError("sample variance needs at least two values")
    m = mean(data)
    total = sum((x - m) ** 2 for x in data)
    return total / (n - 1 if sample else n)


def stdev(data: list[float], sample: bool = True) -> float:
    return math.sqrt(variance(data, sample))


def zscores(data: list[float]) -> list[float]:
    m, s = mean(data), stdev(data)
    if s == 0:
        return [0.0 for _ in data]
    return [(x - m) / s for x in data]


def summary(data: list[float]) -> dict[str, float]:
    return {"n": len(data), "mean": mean(data), "median": median(data),
            "min": min(data), "max": max(data), "stdev": stdev(data)}
'''

TEST_STATS = '''from stats import mean, median, mode, stdev, summary, variance, zscores


def test_mean():
    assert mean([1, 2, 3, 4]) == 2.5, mean([1, 2, 3, 4])


def test_median_odd():
    assert median([3, 1, 2]) == 2, median([3, 1, 2])


def test_median_even():
    assert median([4, 1, 3, 2]) == 2.5, f"median([4, 1, 3, 2]) returned {median([4, 1, 3, 2])}, expected 2.5"


def test_mode():
    assert mode([1, 2, 2, 3, 3]) == 2


def test_variance_and_stdev():
    assert abs(variance([2, 4, 4, 4, 5, 5, 7, 9]) - 4.571428571428571) < 1e-9
    assert abs(stdev([2, 4, 4, 4, 5, 5, 7, 9], sample=False) - 2.0) < 1e-9


def test_zscores():
    assert zscores([5, 5, 5]) == [0.0, 0.0, 0.0]


def test_summary():
    s = summary([1, 2, 3, 4])
    assert s["median"] == 2.5 and s["n"] == 4, s
'''

TEXTUTIL = '''import re
import unicodedata


def slugify(text: str, sep: str = "-") -> str:
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    words = re.findall(r"[a-z0-9]+", text.lower())
    return sep.join(words)


def truncate(text: str, width: int, suffix: str = "...") -> str:
    if len(text) <= width:
        return text
    cut = text[: max(0, width - len(suffix))].rstrip()
    return cut + suffix


def count_words(text: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    for word in re.findall(r"[\\w']+", text.lower()):
        counts[word] = counts.get(word, 0) + 1
    return counts


def wrap(text: str, width: int = 72) -> list[str]:
    lines, line = [], ""
    for word in text.split():
        if line and len(line) + 1 + len(word) > width:
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}" if line else word
    if line:
        lines.append(line)
    return lines


def title_case(text: str, small: frozenset = frozenset({"a", "an", "and", "of", "the", "to"})) -> str:
    words = text.split()
    out = [w if i and w.lower() in small else w[:1].upper() + w[1:] for i, w in enumerate(words)]
    return " ".join(out)
'''

TEST_TEXTUTIL = '''import inspect

import textutil


def test_slugify():
    assert textutil.slugify("Hello, World!") == "hello-world"


def test_truncate():
    assert textutil.truncate("abcdefghij", 6) == "abc..."


def test_wrap():
    assert textutil.wrap("one two three four", 9) == ["one two", "three", "four"]


def test_every_function_has_a_docstring():
    missing = [name for name, fn in inspect.getmembers(textutil, inspect.isfunction) if not fn.__doc__]
    assert not missing, f"functions without a docstring: {', '.join(missing)}"
'''

INVENTORY = '''"""A shop's stock: items, their value, and what to reorder."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Item:
    sku: str
    name: str
    price: float
    quantity: int
    reorder_level: int = 5


def calc_total(items: list[Item]) -> float:
    """The value of the stock: price times quantity, summed."""
    return round(sum(item.price * item.quantity for item in items), 2)


def apply_discount(items: list[Item], percent: float) -> list[Item]:
    """New items whose prices are cut by `percent`."""
    if not 0 <= percent <= 100:
        raise ValueError(f"percent must be between 0 and 100, got {percent}")
    factor = 1 - percent / 100
    return [Item(i.sku, i.name, round(i.price * factor, 2), i.quantity, i.reorder_level) for i in items]


def low_stock(items: list[Item]) -> list[Item]:
    """Items at or below their reorder level, fewest first."""
    return sorted((i for i in items if i.quantity <= i.reorder_level), key=lambda i: i.quantity)


def find(items: list[Item], sku: str) -> Item | None:
    for item in items:
        if item.sku == sku:
            return item
    return None


def restock(items: list[Item], sku: str, amount: int) -> None:
    item = find(items, sku)
    if item is None:
        raise KeyError(sku)
    item.quantity += amount
'''

REPORT = '''"""Text reports over the inventory."""
from __future__ import annotations

from inventory import Item, calc_total, low_stock


def stock_report(items: list[Item]) -> str:
    lines = [f"{'SKU':<8}{'NAME':<20}{'QTY':>5}{'VALUE':>10}"]
    for item in sorted(items, key=lambda i: i.sku):
        value = item.price * item.quantity
        lines.append(f"{item.sku:<8}{item.name:<20}{item.quantity:>5}{value:>10.2f}")
    lines.append(f"{'TOTAL':<33}{calc_total(items):>10.2f}")
    return "\\n".join(lines)


def reorder_report(items: list[Item]) -> str:
    short = low_stock(items)
    if not short:
        return "Nothing to reorder."
    lines = [f"{len(short)} item(s) to reorder:"]
    for item in short:
        lines.append(f"- {item.name} ({item.sku}): {item.quantity} left, reorder at {item.reorder_level}")
    return "\\n".join(lines)


def value_share(items: list[Item]) -> dict[str, float]:
    total = calc_total(items)
    if total == 0:
        return {item.sku: 0.0 for item in items}
    return {item.sku: round(item.price * item.quantity / total, 4) for item in items}
'''

TEST_INVENTORY = '''from inventory import Item, compute_total, low_stock
from report import stock_report, value_share

ITEMS = [Item("A1", "bolt", 0.25, 400), Item("B2", "nut", 0.1, 3), Item("C3", "washer", 0.05, 1000)]


def test_compute_total():
    assert compute_total(ITEMS) == 150.3


def test_low_stock():
    assert [i.sku for i in low_stock(ITEMS)] == ["B2"]


def test_report_total_line():
    assert stock_report(ITEMS).splitlines()[-1].endswith("150.30")


def test_value_share():
    assert value_share(ITEMS)["A1"] == round(100 / 150.3, 4)
'''

CONFIG = '''"""Read INI-like configuration text: sections, key = value pairs, typed values."""
from __future__ import annotations


class ConfigError(ValueError):
    pass


def parse_value(raw: str):
    raw = raw.strip()
    if raw.lower() in ("true", "yes", "on"):
        return True
    if raw.lower() in ("false", "no", "off"):
        return False
    for kind in (int, float):
        try:
            return kind(raw)
        except ValueError:
            pass
    if len(raw) >= 2 and raw[0] == raw[-1] and raw[0] in "\\"'":
        return raw[1:-1]
    return raw


def parse_config(text: str) -> dict[str, dict]:
    config: dict[str, dict] = {"default": {}}
    section = "default"
    for lineno, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line:
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1].strip()
            config.setdefault(section, {})
            continue
        if "=" not in line:
            raise ConfigError(f"line {lineno}: expected key = value, got {line!r}")
        key, value = line.split("=", 1)
        config[section][key.strip()] = parse_value(value)
    return config


def get(config: dict[str, dict], dotted: str, default=None):
    section, _, key = dotted.rpartition(".")
    return config.get(section or "default", {}).get(key, default)
'''

TEST_CONFIG = '''from config import ConfigError, get, parse_config

TEXT = """
# the server
[server]
host = example.org
port = 8080   ; the public port
debug = no

[paths]
; where the data lives
root = "/srv/data"
"""


def test_sections_and_types():
    c = parse_config("[a]\\nx = 1\\ny = 2.5\\nz = yes\\n")
    assert c["a"] == {"x": 1, "y": 2.5, "z": True}


def test_comments_are_ignored():
    c = parse_config(TEXT)
    assert get(c, "server.port") == 8080, get(c, "server.port")
    assert get(c, "paths.root") == "/srv/data"


def test_bad_line():
    try:
        parse_config("[a]\\nnonsense\\n")
    except ConfigError as exc:
        assert "line 2" in str(exc)
    else:
        raise AssertionError("no ConfigError")
'''

BACKUP = '''"""Copy a directory tree to a dated backup folder and prune old backups."""
from __future__ import annotations

import shutil
import time
from pathlib import Path


def backup_name(now: float | None = None) -> str:
    return time.strftime("backup-%Y%m%d-%H%M%S", time.gmtime(now if now is not None else time.time()))


def copy_tree(src: Path, dest: Path) -> int:
    count = 0
    for path in sorted(src.rglob("*")):
        target = dest / path.relative_to(src)
        if path.is_dir():
            target.mkdir(parents=True, exist_ok=True)
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, target)
        count += 1
    print(f"copied {count} files from {src} to {dest}")
    return count


def prune(root: Path, keep: int) -> list[Path]:
    backups = sorted(p for p in root.glob("backup-*") if p.is_dir())
    removed = backups[:-keep] if keep > 0 else backups
    for path in removed:
        print(f"removing old backup {path.name}")
        shutil.rmtree(path)
    return removed


def run(src: Path, root: Path, keep: int = 3) -> Path:
    if not src.is_dir():
        print(f"error: {src} is not a directory")
        raise NotADirectoryError(src)
    dest = root / backup_name()
    print(f"backing up {src} to {dest}")
    copy_tree(src, dest)
    prune(root, keep)
    print("done")
    return dest
'''

TEST_BACKUP = '''import inspect
import logging

import backup


def test_backup_name():
    assert backup.backup_name(0) == "backup-19700101-000000"


def test_uses_logging_not_print():
    source = inspect.getsource(backup)
    assert "print(" not in source, "backup.py still calls print()"
    assert isinstance(getattr(backup, "logger", None), logging.Logger), "backup.py has no module-level logger"
'''

TASKS = [
    Task("stats-median", "calib", "The test suite fails. Run the tests, read stats.py, fix the bug there (not in "
         "the tests) by writing the whole corrected file with write_file, and run the tests again.", {"stats.py": STATS, "test_stats.py": TEST_STATS}),
    Task("textutil-docstrings", "calib", "Read textutil.py, then write it back with write_file with a one-line "
         "docstring added to every function and the code otherwise unchanged, then run the tests.", {"textutil.py": TEXTUTIL, "test_textutil.py": TEST_TEXTUTIL}),
    Task("inventory-rename", "test", "Rename the function calc_total to compute_total: read inventory.py and "
         "report.py, write each back in full with write_file using the new name, then run the tests.", {"inventory.py": INVENTORY, "report.py": REPORT,
                                           "test_inventory.py": TEST_INVENTORY}),
    Task("config-comments", "test", "test_comments_are_ignored fails. Read config.py and test_config.py, make "
         "parse_config ignore comment lines and inline comments (starting with # or ;) by writing the whole new "
         "config.py with write_file, then run the tests.", {"config.py": CONFIG,
                                                                         "test_config.py": TEST_CONFIG}),
    Task("backup-logging", "test", "Read backup.py and write it back in full with write_file, every print call "
         "replaced by logging through a module-level logger (logger = logging.getLogger(__name__)), then run the "
         "tests.", {"backup.py": BACKUP,
                                                                               "test_backup.py": TEST_BACKUP}),
]


def tasks(split: str) -> list[Task]:
    return [t for t in TASKS if split == "all" or t.split == split]
