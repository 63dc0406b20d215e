"""Fuzz: random bundle corruptions and random generation arguments (seeded, so a failure replays).

Every outcome must be a clean result or an EdgespecError with a one-line message: never another
exception, never a hang (a watchdog kills the run after WATCHDOG_S), and never silently wrong text:
- a corruption the chosen check covers (every file under verify="full"; every small file, and the
  size of large ones, under "fast") must raise, or leave the output equal to the intact bundle's;
- a successful generation with valid greedy arguments must equal the intact bundle's `ar` output.
"""
import faulthandler
import json
import shutil

import numpy as np
import pytest

from edgespec.errors import EdgespecError
from edgespec.runtime import Bundle, SpeculativeDecoder

CORRUPTION_CASES = 120
ARGUMENT_CASES = 200
WATCHDOG_S = 600
PROMPT = "The quick brown"
TOKENS = 6


@pytest.fixture(autouse=True)
def _watchdog():
    faulthandler.dump_traceback_later(WATCHDOG_S, exit=True)
    yield
    faulthandler.cancel_dump_traceback_later()


@pytest.fixture(scope="module")
def reference(tiny_self_bundle):
    dec = SpeculativeDecoder(Bundle.load(tiny_self_bundle, verify="full"), strategy="ar", threads=1)
    return dec.generate(PROMPT, max_new_tokens=TOKENS).token_ids


def _one_line(exc: EdgespecError) -> None:
    assert str(exc) and "\n" not in str(exc), repr(exc)


# --------------------------------------------------------------------------- corruptions

def _random_value(rng):
    return [None, -1, 0, 10**12, 2.5, "", "../../etc/hostname", "/etc/hostname", "x" * 300, [], {}, True,
            "target/../../outside.onnx", float("nan")][rng.integers(14)]


def _edit_manifest(path, rng) -> str:
    m = json.loads(path.read_text())
    node, keys = m, []
    while isinstance(node, dict) and node and (not keys or rng.random() < 0.7):
        k = list(node)[rng.integers(len(node))]
        keys.append(k)
        if not isinstance(node[k], dict):
            break
        node = node[k]
    parent = m
    for k in keys[:-1]:
        parent = parent[k]
    if rng.random() < 0.25:
        del parent[keys[-1]]
        what = "delete"
    else:
        parent[keys[-1]] = _random_value(rng)
        what = f"set {parent[keys[-1]]!r}"
    path.write_text(json.dumps(m))
    return f"manifest {'.'.join(map(str, keys))}: {what}"


def _corrupt(root, rng) -> tuple[str, str]:
    """Apply one random corruption; returns (description, the file it touched, relative)."""
    files = sorted(p for p in root.rglob("*") if p.is_file())
    kind = ["truncate", "flip", "manifest", "manifest", "delete"][rng.integers(5)]
    if kind == "manifest":
        return _edit_manifest(root / "manifest.json", rng), "manifest.json"
    f = files[rng.integers(len(files))]
    rel = str(f.relative_to(root))
    data = bytearray(f.read_bytes())
    if kind == "delete":
        f.unlink()
        return f"delete {rel}", rel
    if kind == "truncate":
        f.write_bytes(bytes(data[:int(rng.integers(len(data))) if data else 0]))
        return f"truncate {rel}", rel
    for _ in range(int(rng.integers(1, 64))):
        if data:
            data[int(rng.integers(len(data)))] ^= 1 << int(rng.integers(8))
    f.write_bytes(bytes(data))
    return f"flip bytes in {rel}", rel


def test_random_bundle_corruptions(tiny_self_bundle, reference, tmp_path):
    rng = np.random.default_rng(2026)
    outcomes = {"error": 0, "same output": 0}
    for case in range(CORRUPTION_CASES):
        root = tmp_path / f"b{case}"
        shutil.copytree(tiny_self_bundle, root)
        what, rel = _corrupt(root, rng)
        verify = ["full", "fast"][case % 2]
        strategy = ["ar", "tli", "sd"][case % 3]
        try:
            dec = SpeculativeDecoder(Bundle.load(root, verify=verify), strategy=strategy, draft_length=3, threads=1)
            ids = dec.generate(PROMPT, max_new_tokens=TOKENS).token_ids
        except EdgespecError as exc:
            _one_line(exc)
            outcomes["error"] += 1
        except Exception as exc:                       # noqa: BLE001
            pytest.fail(f"case {case} ({what}, verify={verify}): {type(exc).__name__}: {exc}")
        else:
            # Only a byte flip in a large weight file under "fast" may pass unseen: its output is
            # then not checked (NaN/inf logits still raise).
            unseen_ok = verify == "fast" and what.startswith("flip") and rel.endswith((".onnx", ".data"))
            assert unseen_ok or ids == reference, f"case {case}: {what} (verify={verify}) gave other text"
            shutil.rmtree(root)
            outcomes["same output" if ids == reference else "unseen large-file flip"] = \
                outcomes.get("same output" if ids == reference else "unseen large-file flip", 0) + 1
    print(f"{CORRUPTION_CASES} corruption cases: {outcomes}")
    assert outcomes["error"] > CORRUPTION_CASES // 2


# --------------------------------------------------------------------------- arguments

# (valid values, invalid values) per argument; each argument is invalid with probability 0.06
ARGUMENTS = {
    "strategy": (["ar", "tli", "tli", "sd", "slem"], ["nope", "", None, 3]),
    "draft_length": ([1, 3, 5], [0, -1, 65, 10**6, 2.5, "4", True, None]),
    "max_new_tokens": ([TOKENS, TOKENS, 1, 3], [0, -3, 2.0, "5", None]),
    "temperature": ([0.0, 0.0, 0.7, 1.0, 1e-3], [1e-300, -1.0, float("nan"), float("inf"), "1"]),
    "top_k": ([None, None, 1, 5, 10**9], [0, -2, 2.5, "3"]),
    "top_p": ([None, None, 0.9, 1.0], [0.0, 1.5, float("nan"), "0.9"]),
    "seed": ([None, 0, 7, 2**70], [-1, 1.5, "7", True]),
    "stop": ([None, None, "\n", ["a", "b"], ["x" * 10]], ["", [""], [3]]),
    "prompt": ([PROMPT, PROMPT, " ", "é" * 50, [1, 2, 3]], ["", [], [-1], [10**9], ["a"], [[1]], 3.5, None]),
    "chat": ([False, False, True], []),
}


def _random_args(rng) -> dict:
    out = {}
    for name, (good, bad) in ARGUMENTS.items():
        pool = bad if bad and rng.random() < 0.06 else good
        out[name] = pool[rng.integers(len(pool))]
    return out


def test_random_generation_arguments(tiny_self_bundle, reference):
    rng = np.random.default_rng(17)
    bundle = Bundle.load(tiny_self_bundle)
    base = SpeculativeDecoder(bundle, strategy="tli", draft_length=3, threads=1)
    outcomes = {"error": 0, "result": 0, "checked against ar": 0}
    reasons, want = {}, {}
    ar = base.variant("ar")
    for case in range(ARGUMENT_CASES):
        a = _random_args(rng)
        kw = {k: a[k] for k in ("max_new_tokens", "temperature", "top_k", "top_p", "seed", "stop", "chat")}
        try:
            dec = base.variant(strategy=a["strategy"], draft_length=a["draft_length"])
            res = dec.generate(a["prompt"], **kw)
        except EdgespecError as exc:
            _one_line(exc)
            outcomes["error"] += 1
            reasons[str(exc)[:40]] = reasons.get(str(exc)[:40], 0) + 1
            continue
        except Exception as exc:                       # noqa: BLE001
            pytest.fail(f"case {case} {a}: {type(exc).__name__}: {exc}")
        outcomes["result"] += 1
        assert isinstance(res.text, str) and len(res.token_ids) <= kw["max_new_tokens"]
        if kw["temperature"] == 0.0:                   # greedy: must equal ar on the same arguments
            key = json.dumps([a["prompt"], {k: v for k, v in kw.items() if k != "seed"}], default=str)
            if key not in want:
                want[key] = ar.generate(a["prompt"], **kw).token_ids
            assert res.token_ids == want[key], f"case {case} {a}"
            outcomes["checked against ar"] += 1
    print(f"{ARGUMENT_CASES} argument cases: {outcomes}; errors: {sorted(reasons.items(), key=lambda x: -x[1])}")
    assert outcomes["result"] > 0 and outcomes["error"] > 0
