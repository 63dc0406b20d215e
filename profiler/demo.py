"""`edgespec demo` (what `make demo` runs): the product as deployed, end to end, resumable.

1. pull the pair's models (`edgespec models pull`; cached once converted);
2. export the target alone in int4 (`edgespec export --target T --quantize int4`): the model builder's
   graph, cached under <edgespec cache>/onnx, so step 4 reuses it;
3. calibrate on completions the int4 ONNX target generates (`edgespec calibrate --target-bundle`: 118 s
   for 1,024 tokens on the idle 2-core EPYC, where torch fp32 took 860 s; 3:21 against 9:00 on a shared
   Xeon) for the calib split of the prompt set, keeping the pair's K tokens (the same kept set as torch
   fp32's up to sampling noise, and the same acceptance: docs/results.md);
4. export the pair in int4 with that vocabulary (the target graph comes from the cache; the drafter is
   built and pruned). The int4 target's quality check against the fp32 graph is off by default
   (`--quality-tokens 0`: building the 1.5B's fp32 reference, 6 GB, and running it take about 1.5 of
   the demo's minutes; `edgespec export` runs it by default, and docs/results.md quotes its result);
5. bench on prompts of the test split (disjoint from step 3's): `ar`, `ar-fast` (the fastest plain
   decoding, the speed baseline), `auto` (strategy and draft length chosen by the runtime) and, when
   onnxruntime-genai is importable, its own generator on the same graph (`--peers`), greedy;
6. print a one-screen summary: decode tok/s and speedups, the lossless check, where the time went, the
   plot paths.
Each step runs as its own `python -m edgespec` process (an export must not leave its memory to the
bench). A step whose inputs (its command line and the digest of what it reads) match the last
successful run, and whose outputs still exist, is skipped: a second run reuses everything. An
interrupted step is the only one redone; an interrupted bench continues its journal (`--resume`).
State: OUT/demo-state.json. OUT defaults to <edgespec cache>/demo/<pair>.
"""
from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

from edgespec.help_all import add_help_all
from edgespec.models import default_pair, get_pair
from edgespec.paths import cache_home, models_dir
from edgespec.profiler.bench import check_draft_lengths
from edgespec.profiler.errors import BenchError
from edgespec.profiler.report import lossless_line
from edgespec.runtime.bundle.manifest import MANIFEST

STATE = "demo-state.json"
DESCRIPTION = """\
Pull, export (int4), calibrate and bench a pair end to end (`make demo`).
A second run reuses each step whose inputs are unchanged. The steps: --help-all."""
# left out of `demo --help`, listed by --help-all (edgespec/help_all.py)
EXPERT = ("--calib-new-tokens", "--quality-tokens")


def register_demo(subparsers, csv_list, int_list) -> None:
    p = subparsers.add_parser("demo", help="pull, export, calibrate and bench a pair in int4, end to end (make demo)",
                              description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pair", metavar="NAME", help="pair recipe (default qwen-coder; smollm-self is quick)")
    p.add_argument("--out", type=Path, metavar="DIR", help="demo directory (default <cache>/demo/<pair>)")
    p.add_argument("--quantize", default="int4", choices=["int4", "none"], metavar="int4|none",
                   help="graphs' precision (default int4)")
    p.add_argument("--prompt-set", default=None, metavar="SET",
                   help="humaneval or FILE.jsonl: calib split calibrates, test split is benched (default: "
                        "benchmarks/heldout13.jsonl, 13 task categories; humaneval where it is absent)")
    p.add_argument("--calib-tokens", type=int, default=1024, metavar="N",
                   help="target-generated calibration tokens (default 1024)")
    p.add_argument("--calib-new-tokens", type=int, default=96,
                   help="calibration tokens per prompt (default 96: the budget spreads over the categories)")
    p.add_argument("--keep", type=int, metavar="K", help="kept drafter tokens (default: the pair's)")
    p.add_argument("--quality-tokens", type=int, default=0, metavar="N",
                   help="check the int4 target's top-1 agreement with its fp32 graph on N tokens at export "
                        "(default 0: off; edgespec export's default is 512)")
    p.add_argument("--affinity", choices=["cooc", "cov"], metavar="cooc|cov", help="also estimate M (enables the rdk strategy)")
    p.add_argument("--prompts", type=int, default=4, metavar="N", help="test-split prompts to bench (default 4)")
    p.add_argument("--max-new-tokens", type=int, default=64, metavar="N", help="bench tokens per prompt (default 64)")
    p.add_argument("--strategies", type=csv_list, default=["ar", "auto"], metavar="LIST",
                   help="bench's --strategies (default ar,auto)")
    p.add_argument("--draft-length", type=int_list, default=["auto"], metavar="LIST",
                   help="bench's --draft-length (default auto)")
    p.add_argument("--repeats", type=int, default=1, metavar="N", help="bench's --repeats (default 1)")
    p.add_argument("--threads", type=int, default=2, metavar="N",
                   help="ORT threads for calibration and bench (default 2)")
    p.add_argument("--no-peers", action="store_true", help="skip onnxruntime-genai's row even where it is importable")
    p.add_argument("--remeasure", action="store_true", help="re-run the bench even if its inputs are unchanged")
    add_help_all(p, EXPERT, more="\n" + __doc__)
    p.set_defaults(func=run_demo)


HELDOUT = Path(__file__).resolve().parents[1] / "benchmarks" / "heldout13.jsonl"


def default_prompt_set() -> str:
    return str(HELDOUT) if HELDOUT.is_file() else "humaneval"


def peers_importable() -> bool:
    return importlib.util.find_spec("onnxruntime_genai") is not None


def _digest(*parts) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(json.dumps(part, sort_keys=True, default=str).encode("utf-8"))
    return h.hexdigest()[:24]


def _file_digest(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest() if Path(path).is_file() else "-"


class Steps:
    """Runs `python -m edgespec ...` steps, skipping those whose key matches the recorded state."""

    def __init__(self, out: Path):
        self.out = out
        self.path = out / STATE
        try:
            self.state = json.loads(self.path.read_text()) if self.path.is_file() else {}
        except ValueError:
            self.state = {}
        self.times: dict[str, float] = {}

    def _save(self) -> None:
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps(self.state, indent=1) + "\n")
        tmp.replace(self.path)

    def run(self, name: str, argv: list[str], key: str, outputs: list[Path], force: bool = False,
            stdout=None, resume: list[str] | None = None, fresh=None) -> bool:
        """Returns True if the step ran, False if it was reused. `resume`: arguments added when the last
        attempt of this step with the same key was interrupted (a journaled step continues); `fresh()`
        runs before a step that starts over (e.g. clears what an earlier run left)."""
        done = self.state.get(name, {})
        if not force and done.get("key") == key and all(p.exists() for p in outputs):
            print(f"edgespec demo: [{name}] reused (inputs unchanged)", file=sys.stderr)
            self.times[name] = 0.0
            return False
        if resume and not force and done.get("started_key") == key:
            argv = [*argv, *resume]
        elif fresh is not None:
            fresh()
        self.state[name] = {"started_key": key}
        self._save()
        print(f"edgespec demo: [{name}] edgespec {' '.join(argv)}", file=sys.stderr)
        t0 = time.time()
        proc = subprocess.run([sys.executable, "-m", "edgespec", *argv], stdout=stdout)
        self.times[name] = time.time() - t0
        if proc.returncode != 0:
            raise BenchError(f"demo step {name!r} failed (exit {proc.returncode}); fix the error above and re-run "
                             "`edgespec demo` (finished steps are reused)")
        self.state[name] = {"key": key, "seconds": round(self.times[name], 1),
                            "finished_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        self._save()
        return True


def run_demo(args) -> int:
    check_draft_lengths(args.draft_length)             # the bench step's check, before the exports
    pair = get_pair(args.pair) if args.pair else default_pair()
    out = Path(args.out or cache_home() / "demo" / pair.name).expanduser().absolute()
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise BenchError(f"demo directory {out} is not writable ({exc.strerror or exc})") from None
    keep = args.keep or pair.keep
    prompt_set = args.prompt_set or default_prompt_set()
    prompts_key = _file_digest(Path(prompt_set)) if Path(prompt_set).is_file() else prompt_set
    vocab, target, bundle, report = out / "vocab.json", out / "target", out / "bundle", out / "report"
    quant = ["--quantize", args.quantize]
    steps = Steps(out)
    t0 = time.time()

    pulled = [models_dir() / m / "config.json" for m in dict.fromkeys((pair.target, pair.drafter))]
    steps.run("pull", ["models", "pull", pair.name], _digest(pair.name, "pull"), pulled)
    export_target = ["export", "--target", pair.target, *quant, "--quality-tokens", "0", "--out", str(target)]
    steps.run("export-target", export_target, _digest(export_target), [target / MANIFEST])
    calib = ["calibrate", "--pair", pair.name, "--target-bundle", str(target), "--source", "target", "--prompts",
             prompt_set, "--split", "calib", "--max-tokens", str(args.calib_tokens), "--max-new-tokens",
             str(args.calib_new_tokens), "--threads", str(args.threads), "--keep", str(keep), "--out", str(vocab)]
    if args.affinity:
        calib += ["--affinity", args.affinity]
    steps.run("calibrate", calib, _digest(calib, prompts_key, _file_digest(target / MANIFEST)), [vocab])
    export = ["export", "--pair", pair.name, "--vocab", str(vocab), *quant, "--quality-tokens",
              str(args.quality_tokens), "--out", str(bundle)]
    steps.run("export", export, _digest(export, _file_digest(vocab)), [bundle / MANIFEST])
    bench = ["bench", "--bundle", str(bundle), "--prompts", prompt_set, "--split", "test", "--limit",
             str(args.prompts), "--strategies", ",".join(args.strategies), "--draft-length",
             ",".join(map(str, args.draft_length)), "--max-new-tokens", str(args.max_new_tokens), "--temperature", "0",
             "--repeats", str(args.repeats), "--threads", str(args.threads), "--report", str(report)]
    if peers_importable() and not args.no_peers:
        bench.append("--peers")
    steps.run("bench", bench, _digest(bench, prompts_key, _file_digest(bundle / MANIFEST)), [report / "report.json"],
              force=args.remeasure, stdout=subprocess.DEVNULL,    # its table is printed below
              resume=["--resume"] if (report / "records.jsonl").is_file() else None,
              fresh=lambda: shutil.rmtree(report, ignore_errors=True))       # the bench refuses an old journal
    print(summary(json.loads((report / "report.json").read_text()), report, steps.times, time.time() - t0))
    return 0


def summary(doc: dict, report: Path, times: dict, total_s: float) -> str:
    """One screen: speeds against the baseline, the lossless check, where the time went, the files."""
    b, st = doc["bundle"], doc["settings"]
    runs = doc["runs"]
    base = next((r["strategy"] for r in runs if r["strategy"] == "ar-fast"), "ar")
    lines = [f"edgespec demo: pair {b['pair']}, drafter keeps {b['kept']} tokens; {len(st['prompts_used'])} held-out "
             f"prompt(s) ({Path(str(st['prompts'])).name}, split {st['split']}) x {st['max_new_tokens']} new tokens, "
             f"greedy", "",
             f"{'row':<20}{'decode tok/s':>13}{'decode x':>10}{'e2e tok/s':>11}{'e2e x':>8}{'accept':>8}{'mean γ':>8}"]
    for r in runs:
        label = r["strategy"] + (" (baseline)" if r["strategy"] == base else "")
        lines.append(f"{label:<20}{_f(r.get('decode_tokens_per_s')):>13}{_f(r.get('decode_speedup')):>10}"
                     f"{_f(r.get('tokens_per_s')):>11}{_f(r.get('speedup')):>8}{_f(r.get('acceptance_rate')):>8}"
                     f"{_f(r.get('mean_gamma')):>8}")
    device = doc.get("device_plan") or {}
    lines += [f"x = speedup against {base}, the fastest plain decoding of this graph: 'decode' after the first token "
              "(decode rate), 'e2e' with the prefill (end to end).", "", lossless_line(doc), "",
              f"the default decoder's {device.get('plan', 'plan: not recorded (a report from before 2026-11-27)')}"
              + (f" (device profile {device['profile']['measure_s']:.1f} s, once per machine)"
                 if device.get("profile") else ""), "",
              "where the time went, ms per generated token (drafter prefill: ms per prompt):",
              f"{'row':<20}{'prefill':>9}{'drafter prefill':>17}{'draft':>8}{'verify':>8}{'overhead':>10}"]
    for r in runs:
        if not r.get("verify_ms_per_token"):          # a peer's own generator: no per-part timing
            lines.append(f"{r['strategy']:<20}  (its own generator: {_f(r.get('tpot_ms'), '.1f')} ms per token after "
                         "the first, no breakdown)")
            continue
        lines.append(f"{r['strategy']:<20}{_f(r.get('prefill_ms_per_token'), '.1f'):>9}"
                     f"{_f(r.get('draft_prefill_ms') or None, '.0f'):>17}{_f(r.get('draft_ms_per_token'), '.1f'):>8}"
                     f"{_f(r.get('verify_ms_per_token'), '.1f'):>8}{_f(r.get('overhead_ms_per_token'), '.2f'):>10}")
    quality = (((b.get("target") or {}).get("quantization") or {}).get("quality") or {}).get("top1_agreement")
    lines += ["", f"int4 target against its fp32 graph: top-1 agreement {quality:.3f}" if quality is not None else
              "int4 target against its fp32 graph: not checked (demo --quality-tokens 512 adds it)"]
    lines += ["", f"report: {report / 'report.md'}"]
    lines += [f"plot:   {report / name}" for name in doc.get("plots", [])]
    steps = ", ".join(f"{k} {v:.0f} s" for k, v in times.items())
    lines.append(f"\ndemo finished in {total_s:.0f} s ({steps})")
    return "\n".join(lines)


def _f(x, fmt: str = ".2f") -> str:
    return "-" if x is None else format(x, fmt)
