"""`edgespec bench` on the tiny bundles: the report's formulas and consistency, bad input, Ctrl-C.
No timing assertions: only that reported numbers follow from the reported parts and the raw records."""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import pytest

from edgespec.cli import main
from edgespec.errors import EdgespecError, EPError, GenerationError
from edgespec.profiler.bench import check_settings, decoder_family, run_bench
from edgespec.profiler.cli import _draft_lengths, bench_settings, register_bench
from edgespec.profiler.errors import BenchError
from edgespec.profiler.settings import BenchSettings
from edgespec.runtime import Bundle

RUN_FIELDS = ("strategy", "draft_length", "acceptance_rate", "tau", "tokens_per_s", "speedup", "ttft_ms", "tpot_ms",
              "c_params", "c_bytes", "c_time", "mbsu_params", "mbsu_bytes", "mbsu_time", "realisation",
              "bandwidth_gbs", "bandwidth_fraction", "providers")
PROMPTS = [
    {"question_id": 1, "category": "code", "turns": ["def add(a, b):\n    return"]},
    {"question_id": 2, "category": "code", "turns": ["class Counter:\n    def __init__(self):"]},
    {"question_id": 3, "category": "prose", "turns": ["The quick brown fox"]},
    {"question_id": 4, "category": "prose", "turns": ["On edge devices memory bandwidth"]},
]


@pytest.fixture(autouse=True)
def _one_thread(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")


@pytest.fixture
def prompts_file(tmp_path) -> Path:
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in PROMPTS))
    return path


def settings(bundle, prompts, report, **kw) -> BenchSettings:
    base = dict(bundle=bundle, report=report, prompts=str(prompts), split="all", strategies=["ar", "tli"],
                draft_lengths=[1, 3], max_new_tokens=12, repeats=2, threads=1, bandwidth_mb=8, progress=False)
    base.update(kw)
    return BenchSettings(**base)


def close(a, b, rel=1e-9):
    return a == pytest.approx(b, rel=rel)


def test_a_seeded_sampled_bench_checks_its_coupled_rows_against_ar(tiny_self_bundle, prompts_file, tmp_path):
    """Seeded, every row samples by the race unless it turns it off: coupled rows are compared with ar (and
    equal it), a coupled_sampling=false row is not; a differing coupled row is reported as a failure."""
    from edgespec.profiler.report import lossless_line
    out = tmp_path / "report"
    rc = main(["bench", "--bundle", str(tiny_self_bundle), "--prompts", str(prompts_file), "--split", "all",
               "--strategies", "ar,tli,tli:coupled_sampling=false", "--draft-length", "3", "--max-new-tokens", "12",
               "--temperature", "0.8", "--seed", "5", "--threads", "1", "--bandwidth-mb", "8", "--quiet",
               "--report", str(out)])
    assert rc == 0
    doc = json.loads((out / "report.json").read_text())
    runs = {r["strategy"]: r for r in doc["runs"]}
    assert runs["tli"]["outputs_differing_from_ar"] == 0
    n = runs["tli"]["prompts"] * runs["tli"]["repeats_measured"]
    assert f"Seeded sampled outputs identical to ar's with the same seed in all {n} coupled generations" in \
        (out / "report.md").read_text()
    broken = json.loads(json.dumps(doc))
    next(r for r in broken["runs"] if r["strategy"] == "tli")["outputs_differing_from_ar"] = 1
    assert lossless_line(broken).startswith("**SEEDED CHECK FAILED**: seeded outputs differing from ar's: tli γ=3: 1")
    unseeded = json.loads(json.dumps(broken))
    unseeded["settings"]["seed"] = None
    assert lossless_line(unseeded).startswith("Sampling: outputs are not compared with ar")


def test_bench_cli_report_is_consistent(tiny_self_bundle, prompts_file, tmp_path):
    out = tmp_path / "report"
    rc = main(["bench", "--bundle", str(tiny_self_bundle), "--prompts", str(prompts_file), "--split", "all",
               "--strategies", "ar,tli", "--draft-length", "1,3", "--max-new-tokens", "12", "--repeats", "2",
               "--threads", "1", "--bandwidth-mb", "8", "--quiet", "--report", str(out)])
    assert rc == 0
    doc = json.loads((out / "report.json").read_text())
    assert (out / "report.md").read_text().count("| tli |") >= 2
    assert {"machine", "versions", "bundle", "settings", "runs"} <= set(doc) and doc["partial"] is False
    assert len(doc["bundle"]["manifest_sha256"]) == 64
    for name in doc["plots"]:
        assert (out / name).stat().st_size > 0
    runs = {(r["strategy"], r["draft_length"]): r for r in doc["runs"]}
    assert set(runs) == {("ar", 0), ("tli", 1), ("tli", 3)}
    ar = runs[("ar", 0)]
    assert ar["speedup"] == 1.0 and ar["tau"] == 1.0 and ar["mbsu_time"] == 1.0
    # greedy: every strategy's output equals ar's, and the report says so
    assert all(r["outputs_differing_from_ar"] == 0 for r in doc["runs"])
    assert "Greedy outputs identical to ar, token for token, in all 16 generations" in (out / "report.md").read_text()
    broken = json.loads(json.dumps(doc))
    broken["runs"][1]["outputs_differing_from_ar"] = 1
    from edgespec.profiler.report import lossless_line
    assert lossless_line(broken).startswith("**LOSSLESS CHECK FAILED**: greedy outputs differing from ar: tli γ=1: 1")
    manifest = json.loads((Path(tiny_self_bundle) / "manifest.json").read_text())
    t_bpf, d_bpf = manifest["target"]["bytes_per_forward"], manifest["drafter"]["bytes_per_forward"]
    gens = doc["generations"]
    assert len(gens) == 2 * len(PROMPTS) * 3
    for key, run in runs.items():
        assert all(f in run for f in RUN_FIELDS)
        assert "CPUExecutionProvider" in run["providers"]["target"]
        g = run["draft_length"]
        # MBSU and realisation from the reported parts
        for c in ("params", "bytes", "time"):
            cval = run[f"c_{c}"]
            expect = run["tau"] if g == 0 else run["tau"] / (cval * g + 1)
            assert close(run[f"mbsu_{c}"], expect)
        assert close(run["realisation"], run["speedup"] / run["mbsu_time"])
        assert close(run["bandwidth_fraction"], run["bandwidth_gbs"] / doc["machine"]["stream_read_gbs"])
        if g:
            assert close(run["c_params"], manifest["drafter"]["params_pruned"] / manifest["target"]["graph_params"])
            assert close(run["c_bytes"], d_bpf / t_bpf)
            assert close(run["c_time"], run["draft_step_ms"] / run["target_decode_ms"])
        # speedup = ar time / this run's time on the same prompts (greedy: same token counts)
        for rep in run["repeats"]:
            assert rep["new_tokens"] == rep["ar_new_tokens"]
            assert close(rep["speedup"], rep["ar_total_ms"] / rep["total_ms"])
            mine = [x for x in gens if (x["strategy"], x["draft_length"]) == key and x["repeat"] == rep["repeat"]]
            assert close(rep["total_ms"], sum(x["total_ms"] for x in mine))
            assert rep["drafted"] == sum(x["drafted"] for x in mine)
            weight = sum(t_bpf * x["target_forwards"] + d_bpf * x["draft_forwards"] for x in mine)
            assert close(rep["bandwidth_gbs"], weight / (rep["total_ms"] / 1e3) / 1e9)
        assert close(run["speedup"], statistics.median(r["speedup"] for r in run["repeats"]))
        if g:
            drafted = sum(x["drafted"] for x in gens if (x["strategy"], x["draft_length"]) == key)
            accepted = sum(x["accepted"] for x in gens if (x["strategy"], x["draft_length"]) == key)
            assert close(run["acceptance_rate"], accepted / drafted)       # greedy: identical across repeats
            assert set(run["by_category"]) == {"code", "prose"}



def test_report_fields_on_a_hand_worked_example():
    """One prompt, by hand. ar: 10 tokens in 400 ms (TTFT 20), decode steps 38/40/42 ms. tli k=4: 10 tokens
    in 200 ms (TTFT 20) over 3 verify forwards, 12 drafted, 6 accepted, drafter steps 5/6/7 ms.
    speedup = (10/0.2 s) / (10/0.4 s) = 2; decode speedup = (9/0.18 s) / (9/0.38 s) = 38/18;
    tau = 9 tokens after the first / 3 verifies = 3; c_time = 6/40 = 0.15, MBSU = 3 / (0.15*4 + 1) = 1.875,
    realisation = 2 / 1.875 = 16/15; c_params = 250/1000, c_bytes = 100/400: MBSU = 3 / 2 = 1.5;
    weights read = 4 target forwards x 400 B + 12 drafter forwards x 100 B = 2800 B in 0.2 s = 14 kB/s."""
    from edgespec.profiler.aggregate import derived, repeat_summary
    common = dict(prefill_tokens=1, ttft_ms=20.0, prefill_ms=20.0, draft_prefill_ms=0.0, reused_tokens=0,
                  peak_rss_mb=1.0, overhead_ms=0.0, sampler_ms=0.0, verify_ms=0.0)
    ar = dict(common, new_tokens=10, total_ms=400.0, drafted=0, accepted=0, verify_forwards=0, target_forwards=10,
              draft_forwards=0, draft_ms=0.0, decode_ms_steps=[38.0, 40.0, 42.0])
    tli = dict(common, new_tokens=10, total_ms=200.0, drafted=12, accepted=6, verify_forwards=3, target_forwards=4,
               draft_forwards=12, draft_ms=18.0, draft_ms_steps=[5.0, 7.0, 6.0])
    manifest = {"target": {"graph_params": 1000, "bytes_per_forward": 400},
                "drafter": {"params_pruned": 250, "bytes_per_forward": 100}}
    rep = repeat_summary([tli], [ar], 4, manifest)
    assert rep["speedup"] == pytest.approx(2.0) and rep["decode_speedup"] == pytest.approx(38 / 18)
    assert rep["tau"] == pytest.approx(3.0) and rep["acceptance_rate"] == pytest.approx(0.5)
    assert rep["c_time"] == pytest.approx(0.15) and rep["bandwidth_gbs"] == pytest.approx(14e3 / 1e9)
    out = derived({**rep, "draft_length": 4, "draft_length_setting": 4}, manifest, stream_gbs=28e3 / 1e9)
    assert out["mbsu_time"] == pytest.approx(1.875) and out["realisation"] == pytest.approx(16 / 15)
    assert out["c_params"] == out["c_bytes"] == pytest.approx(0.25)
    assert out["mbsu_params"] == out["mbsu_bytes"] == pytest.approx(1.5)
    assert out["bandwidth_fraction"] == pytest.approx(0.5)

def test_variant_decoders_match_fresh_ones(tiny_hetero_bundle):
    """Decoders sharing sessions (bench, via SpeculativeDecoder.variant) decode exactly like fresh ones."""
    from edgespec.runtime.api.decoder import SpeculativeDecoder

    bundle = Bundle.load(tiny_hetero_bundle)
    s = BenchSettings(bundle=tiny_hetero_bundle, report=Path("unused"), threads=1)
    family = decoder_family(bundle, [("ar", 0), ("tli", 1), ("tli", 3)], s)
    assert family[("tli", 1)].target is family[("tli", 3)].target
    # the baseline has a target session of its own, spinning as a user's target-only decoder's does
    assert family[("ar", 0)].target is not family[("tli", 1)].target and family[("ar", 0)].drafter is None
    two = decoder_family(bundle, [("ar", 0), ("tli", 1)], BenchSettings(bundle=tiny_hetero_bundle, report=Path("u"),
                                                                          threads=2))
    stops = [two[k].target.session.get_session_options().get_session_config_entry("session.force_spinning_stop")
             for k in (("ar", 0), ("tli", 1))]
    assert stops == ["0", "1"]
    for (strategy, g), dec in family.items():
        fresh = SpeculativeDecoder(bundle, strategy=strategy, draft_length=max(g, 1), threads=1)
        a = dec.generate("def quicksort(items):", max_new_tokens=20)
        b = fresh.generate("def quicksort(items):", max_new_tokens=20)
        assert a.token_ids == b.token_ids
        assert (a.stats.drafted, a.stats.accepted) == (b.stats.drafted, b.stats.accepted)


def test_strategy_rows_with_their_own_options(tiny_self_bundle, prompts_file, tmp_path):
    """`NAME:KEY=VALUE` makes a row of its own: its options reach only that row's decoder."""
    from edgespec.profiler.bench import parse_strategy

    assert parse_strategy("rdk-taylor:rdk_beta=1000:rdk_tol=0.5") == ("rdk-taylor", {"rdk_beta": 1000, "rdk_tol": 0.5})
    assert parse_strategy("tli:draft_probability=auto") == ("tli", {"draft_probability": "auto"})
    with pytest.raises(BenchError, match="KEY=VALUE"):
        parse_strategy("tli:draft_probability")
    bundle = Bundle.load(tiny_self_bundle)
    s = BenchSettings(bundle=tiny_self_bundle, report=Path("unused"), threads=1)
    configs = [("ar", 0), ("tli", 2), ("tli:draft_probability=0.5", 2)]
    family = decoder_family(bundle, configs, s)
    assert family[("tli", 2)].config.draft_probability is None
    assert family[("tli:draft_probability=0.5", 2)].config.draft_probability == 0.5
    assert family[("tli:draft_probability=0.5", 2)].strategy.name == "tli"
    doc = run_bench(settings(tiny_self_bundle, prompts_file, tmp_path / "r", strategies=["ar", "tli",
                             "tli:draft_probability=0.5"], draft_lengths=[2], repeats=1, warmup=False))
    assert [r["strategy"] for r in doc["runs"]] == ["ar", "tli", "tli:draft_probability=0.5"]


def test_interrupted_bench_writes_partial_report(tiny_same_bundle, prompts_file, tmp_path):
    seen = []

    def hook(record):
        seen.append(record)
        if len(seen) == 5:      # ar, tli1, tli3 of prompt 1, then ar and tli1 of prompt 2
            raise KeyboardInterrupt

    doc = run_bench(settings(tiny_same_bundle, prompts_file, tmp_path / "r"), hook=hook)
    saved = json.loads((tmp_path / "r" / "report.json").read_text())
    assert doc["partial"] is True and saved["partial"] is True
    assert len(saved["generations"]) == 5
    runs = {(r["strategy"], r["draft_length"]): r for r in saved["runs"]}
    assert runs[("ar", 0)]["prompts"] == 2 and runs[("tli", 1)]["prompts"] == 2 and runs[("tli", 3)]["prompts"] == 1
    assert "PARTIAL" in (tmp_path / "r" / "report.md").read_text()


def test_killed_bench_resumes_from_its_journal(tiny_same_bundle, prompts_file, tmp_path):
    """A run cut off mid-way (and with a half-written last journal line, as after a kill) resumes: only the
    missing generations are measured, with the same seeds, so the outputs equal an uninterrupted run's."""
    kw = dict(temperature=1.0, repeats=1, warmup=False)
    full = run_bench(settings(tiny_same_bundle, prompts_file, tmp_path / "full", **kw))
    seen = []

    def stop_after_4(record):
        seen.append(record)
        if len(seen) == 4:
            raise KeyboardInterrupt

    run_bench(settings(tiny_same_bundle, prompts_file, tmp_path / "r", **kw), hook=stop_after_4)
    journal = tmp_path / "r" / "records.jsonl"
    assert len(journal.read_text().splitlines()) == 1 + 4
    with open(journal, "a") as f:
        f.write('{"repeat": 0, "prompt_id": "3", "strat')           # killed mid-write
    with pytest.raises(BenchError, match="--resume"):                # a fresh run must not overwrite it
        run_bench(settings(tiny_same_bundle, prompts_file, tmp_path / "r", **kw))
    with pytest.raises(BenchError, match="temperature"):             # nor may a resume change the settings
        run_bench(settings(tiny_same_bundle, prompts_file, tmp_path / "r", **{**kw, "temperature": 0.5}, resume=True))
    lines = journal.read_text().splitlines(keepends=True)        # a journal from before the prefill_graph key
    header = json.loads(lines[0])
    del header["fingerprint"]["prefill_graph"]
    journal.write_text(json.dumps(header) + "\n" + "".join(lines[1:]))
    new = []
    doc = run_bench(settings(tiny_same_bundle, prompts_file, tmp_path / "r", **kw, resume=True), hook=new.append)
    assert doc["partial"] is False and doc["resumed_generations"] == 4
    assert len(new) == len(full["generations"]) - 4
    key = lambda g: (g["prompt_id"], g["strategy"], g["draft_length"])       # noqa: E731
    assert sorted(map(key, doc["generations"])) == sorted(map(key, full["generations"]))
    want = {key(g): g["output_sha256"] for g in full["generations"]}
    assert all(want[key(g)] == g["output_sha256"] for g in doc["generations"])
    assert len(journal.read_text().splitlines()) == 1 + len(full["generations"])
    with pytest.raises(BenchError, match="does not exist"):
        run_bench(settings(tiny_same_bundle, prompts_file, tmp_path / "none", **kw, resume=True))


# --------------------------------------------------------------------------- bad input

def test_prompts_file_without_usable_prompts(tiny_self_bundle, tmp_path):
    empty_texts = tmp_path / "blank.jsonl"
    empty_texts.write_text('{"question_id": 1, "category": "x", "turns": ["   "]}\n{"id": 2, "text": ""}\n')
    with pytest.raises(BenchError, match="no usable prompts"):
        run_bench(settings(tiny_self_bundle, empty_texts, tmp_path / "r"))
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(EdgespecError, match="no prompts"):
        run_bench(settings(tiny_self_bundle, empty, tmp_path / "r"))
    assert not (tmp_path / "r" / "report.json").exists()


def test_unknown_split_or_category(tiny_self_bundle, prompts_file, tmp_path):
    with pytest.raises(BenchError, match="unknown split 'dev'"):
        run_bench(settings(tiny_self_bundle, prompts_file, tmp_path / "r", split="dev"))
    with pytest.raises(BenchError, match="unknown category 'math'.*code, prose"):
        run_bench(settings(tiny_self_bundle, prompts_file, tmp_path / "r", categories=["code", "math"]))


def test_strategy_the_bundle_cannot_serve(tiny_self_bundle, prompts_file, tmp_path):
    assert Bundle.load(tiny_self_bundle).affinity is None
    with pytest.raises(GenerationError, match="affinity"):
        run_bench(settings(tiny_self_bundle, prompts_file, tmp_path / "r", strategies=["ar", "tli", "rdk"]))
    with pytest.raises(GenerationError, match="unknown strategy"):
        run_bench(settings(tiny_self_bundle, prompts_file, tmp_path / "r", strategies=["ar", "nope"]))
    assert not (tmp_path / "r" / "report.json").exists()


def test_inactive_execution_provider(tiny_self_bundle, prompts_file, tmp_path):
    # DirectML exists only on Windows builds: never active here
    with pytest.raises(EPError, match="DmlExecutionProvider"):
        run_bench(settings(tiny_self_bundle, prompts_file, tmp_path / "r", ep="dml"))


def test_report_dir_not_writable(tiny_self_bundle, prompts_file, tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    with pytest.raises(BenchError, match="not writable"):
        run_bench(settings(tiny_self_bundle, prompts_file, blocker / "report"))
    rc = main(["bench", "--bundle", str(tiny_self_bundle), "--prompts", str(prompts_file), "--report",
               str(blocker / "report")])
    assert rc == 2 and "edgespec: error: report directory" in capsys.readouterr().err


def test_bad_settings(tiny_self_bundle, prompts_file, tmp_path):
    for kw, msg in ((dict(draft_lengths=[0]), "draft-length"), (dict(repeats=0), "repeats"),
                    (dict(temperature=-1.0), "temperature"), (dict(strategies=["tli", "tli"]), "twice")):
        with pytest.raises(BenchError, match=msg):
            run_bench(settings(tiny_self_bundle, prompts_file, tmp_path / "r", **kw))


# --------------------------------------------------------------------------- draft_length auto, ngram, statistics

def _journal(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()[1:]]


def _expected_drafting(recs: list[dict]) -> dict:
    """The report's pooled drafting statistics, recomputed from the journal's per-round lists."""
    acc = [a for r in recs for a in r["accepted_per_step"]]
    dra = [d for r in recs for d in r["drafted_per_step"]]
    gam = [g for r in recs for g in r["gamma_per_step"]]
    by_pos = []
    for j in range(1, max(dra, default=0) + 1):
        reached = [a >= j for d, a in zip(dra, acc) if d >= j and a >= j - 1]
        by_pos.append(sum(reached) / len(reached) if reached else None)
    rounds = [a for d, a in zip(dra, acc) if d > 0]
    hist: dict = {}
    for g in gam:
        hist[str(g)] = hist.get(str(g), 0) + 1
    return {"mean_gamma": sum(gam) / len(gam), "gamma_histogram": hist, "acceptance_by_position": by_pos,
            "zero_accept_share": sum(a == 0 for a in rounds) / len(rounds) if rounds else None,
            "fallback_share": sum(r["fallback_ms"] for r in recs) / sum(r["total_ms"] - r["ttft_ms"] for r in recs)}


def test_auto_draft_length_and_ngram_rows(tiny_self_bundle, prompts_file, tmp_path):
    """`--draft-length 2,auto` adds an auto row per strategy (max_draft_length = 2, the largest number); its
    draft_length is the mean gamma chosen and its MBSU uses it; ngram (no drafter) runs beside tli; the
    pooled statistics follow from the journal; an interrupted auto run resumes by (strategy, setting)."""
    out = tmp_path / "r"
    argv = ["bench", "--bundle", str(tiny_self_bundle), "--prompts", str(prompts_file), "--limit", "2",
            "--strategies", "ar,tli,ngram", "--draft-length", "2,auto", "--max-new-tokens", "10", "--repeats", "1",
            "--no-warmup", "--threads", "1", "--bandwidth-mb", "0", "--quiet", "--report", str(out)]
    seen = []

    def stop_after_3(record):
        seen.append(record)
        if len(seen) == 3:              # ar, tli 2, tli auto of the first prompt
            raise KeyboardInterrupt

    parser = argparse.ArgumentParser()
    register_bench(parser.add_subparsers())
    s = bench_settings(parser.parse_args(argv))
    assert s.draft_lengths == [2, "auto"] and s.max_draft_length == 8 and s.split == "all"   # 2 does not cap auto
    assert run_bench(s, hook=stop_after_3)["partial"] is True
    assert seen[2]["draft_length_setting"] == "auto"
    assert main([*argv, "--resume"]) == 0
    doc = json.loads((out / "report.json").read_text())
    assert doc["partial"] is False and doc["resumed_generations"] == 3 and len(doc["generations"]) == 2 * 5
    runs = {(r["strategy"], r["draft_length_setting"]): r for r in doc["runs"]}
    assert list(runs) == [("ar", 0), ("tli", 2), ("tli", "auto"), ("ngram", 2), ("ngram", "auto")]
    assert all(r["outputs_differing_from_ar"] == 0 for r in doc["runs"])      # auto and ngram are lossless
    assert doc["settings"]["max_draft_length"] == 8
    assert "drafter" not in runs[("ngram", 2)]["providers"] and "drafter" in runs[("tli", 2)]["providers"]
    recs = _journal(out)
    assert len({(r["prompt_id"], r["strategy"], r["draft_length_setting"]) for r in recs}) == 10
    for key, run in runs.items():
        mine = [r for r in recs if (r["strategy"], r["draft_length_setting"]) == key]
        if key[1] == 0:
            assert run["mean_gamma"] is None and run["acceptance_by_position"] is None
            continue
        want = _expected_drafting(mine)
        assert close(run["mean_gamma"], want["mean_gamma"])
        assert run["gamma_histogram"] == want["gamma_histogram"]
        assert max(map(int, run["gamma_histogram"])) <= 2                   # max_draft_length reached the decoder
        assert run["acceptance_by_position"] == pytest.approx(want["acceptance_by_position"])
        assert run["zero_accept_share"] == pytest.approx(want["zero_accept_share"])
        assert close(run["fallback_share"], want["fallback_share"])
        if key[1] == "auto":
            assert close(run["draft_length"], want["mean_gamma"])
            for r in mine:
                assert close(r["draft_length"], sum(r["gamma_per_step"]) / len(r["gamma_per_step"]))
        else:
            assert run["draft_length"] == key[1]
        for c in ("params", "bytes", "time"):                               # MBSU with the (mean) gamma
            if run[f"c_{c}"] is not None:
                assert close(run[f"mbsu_{c}"], run["tau"] / (run[f"c_{c}"] * run["draft_length"] + 1))
    assert runs[("ngram", 2)]["c_time"] == 0.0 and close(runs[("ngram", 2)]["mbsu_bytes"], runs[("ngram", 2)]["tau"])
    md = (out / "report.md").read_text()
    assert "| tli | auto |" in md and "| ngram | auto |" in md and "## Drafting statistics" in md
    assert "auto" not in [g["draft_length"] for g in doc["generations"]]
    assert {g["draft_length_setting"] for g in doc["generations"]} == {0, 2, "auto"}


def test_ngram_without_a_drafter_strategy(tiny_self_bundle, prompts_file, tmp_path):
    """ar and ngram only: no drafter session anywhere; a bench of them runs."""
    from edgespec.runtime.api.decoder import SpeculativeDecoder

    bundle = Bundle.load(tiny_self_bundle)
    assert SpeculativeDecoder(bundle, strategy="ngram", threads=1).drafter is None
    s = BenchSettings(bundle=tiny_self_bundle, report=Path("unused"), threads=1, strategies=["ar", "ngram"],
                      draft_lengths=[3, "auto"])
    family = decoder_family(bundle, s.configs(), s)
    assert list(family) == [("ar", 0), ("ngram", 3), ("ngram", "auto")]
    assert all(d.drafter is None and d.drafter_session_info is None for d in family.values())
    assert family[("ngram", "auto")].setup.governor is not None and family[("ngram", "auto")].config.max_draft_length == 8
    doc = run_bench(settings(tiny_self_bundle, prompts_file, tmp_path / "r", strategies=["ar", "ngram"],
                             draft_lengths=[2], limit=1, max_new_tokens=8, repeats=1, warmup=False, bandwidth_mb=0))
    assert [r["strategy"] for r in doc["runs"]] == ["ar", "ngram"]
    assert all(set(r["providers"]) == {"target"} for r in doc["runs"])


def test_draft_confidence_rows_share_the_sessions(tiny_self_bundle):
    bundle = Bundle.load(tiny_self_bundle)
    s = BenchSettings(bundle=tiny_self_bundle, report=Path("unused"), threads=1)
    family = decoder_family(bundle, [("ar", 0), ("tli", 2), ("tli:draft_confidence=0.5", 2)], s)
    assert family[("tli", 2)].config.draft_confidence is None
    assert family[("tli:draft_confidence=0.5", 2)].config.draft_confidence == 0.5
    assert family[("tli:draft_confidence=0.5", 2)].drafter is family[("tli", 2)].drafter


def test_draft_length_list_parsing():
    assert _draft_lengths("2, 4,AUTO") == [2, 4, "auto"]
    assert _draft_lengths("2,fast") == [2, "fast"]       # kept for check_settings to refuse in one line
    with pytest.raises(BenchError, match="--draft-length needs integers in"):
        check_settings(BenchSettings(bundle=Path("b"), report=Path("r"), draft_lengths=_draft_lengths("2,fast")))
    assert BenchSettings(bundle=Path("b"), report=Path("r"), draft_lengths=["auto"]).max_draft_length == 8
    assert BenchSettings(bundle=Path("b"), report=Path("r"), draft_lengths=[3, "auto", 5]).max_draft_length == 8
    assert BenchSettings(bundle=Path("b"), report=Path("r"), draft_lengths=[3, "auto", 12]).max_draft_length == 12


# --------------------------------------------------------------------------- prompts: resume fingerprint, split

def test_resume_refuses_edited_prompts(tiny_same_bundle, prompts_file, tmp_path):
    """The journal fingerprints the prompts' content: an edited file must not mix two texts under one id."""
    kw = dict(draft_lengths=[2], repeats=1, warmup=False, bandwidth_mb=0, max_new_tokens=6)
    seen = []

    def stop_after_2(record):
        seen.append(record)
        if len(seen) == 2:
            raise KeyboardInterrupt

    run_bench(settings(tiny_same_bundle, prompts_file, tmp_path / "r", **kw), hook=stop_after_2)
    rows = [dict(r) for r in PROMPTS]
    rows[0]["turns"] = ["def sub(a, b):\n    return"]                  # same id, other text
    prompts_file.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(BenchError, match="the prompts changed") as err:
        run_bench(settings(tiny_same_bundle, prompts_file, tmp_path / "r", **kw, resume=True))
    assert "\n" not in str(err.value)
    assert len((tmp_path / "r" / "records.jsonl").read_text().splitlines()) == 1 + 2      # journal untouched


def test_prompts_digest_of_loaded_prompts():
    from edgespec.calibrate.prompts import Prompt
    from edgespec.profiler.journal import prompts_sha256

    a = prompts_sha256("humaneval", None, [Prompt("1", "code", "def f():")])
    assert a == prompts_sha256("humaneval", None, [Prompt("1", "code", "def f():")])
    assert a != prompts_sha256("humaneval", None, [Prompt("1", "code", "def g():")])


def _spec_bench(path: Path, per_category: int, categories: int) -> Path:
    rows = [{"question_id": f"{c}-{i}", "category": f"cat{c}", "turns": [f"Question {i} of category {c}:"]}
            for c in range(categories) for i in range(per_category)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_a_named_prompt_file_is_used_whole_by_default(tiny_self_bundle, tmp_path):
    """--split defaults to test for humaneval only; a user's file is all of it. A split or category filter
    that leaves nothing says which one did."""
    from edgespec.profiler.bench import select_prompts

    assert BenchSettings(bundle=Path("b"), report=Path("r")).split == "test"           # built-in humaneval
    spec = _spec_bench(tmp_path / "spec.jsonl", 2, 13)
    prompts, _ = select_prompts(BenchSettings(bundle=Path("b"), report=Path("r"), prompts=str(spec)))
    assert len(prompts) == 26
    assert len(select_prompts(BenchSettings(bundle=Path("b"), report=Path("r"), prompts=str(spec),
                                            split="test"))[0]) == 13
    two = _spec_bench(tmp_path / "two.jsonl", 1, 2)
    out = tmp_path / "r"
    assert main(["bench", "--bundle", str(tiny_self_bundle), "--prompts", str(two), "--strategies", "ar",
                 "--max-new-tokens", "4", "--repeats", "1", "--no-warmup", "--threads", "1", "--bandwidth-mb", "0",
                 "--quiet", "--report", str(out)]) == 0
    doc = json.loads((out / "report.json").read_text())
    assert doc["settings"]["split"] == "all" and len(doc["settings"]["prompts_used"]) == 2
    with pytest.raises(BenchError, match="--split test leaves none of the 2 prompt") as err:
        run_bench(settings(tiny_self_bundle, two, tmp_path / "r2", split="test"))
    assert "empty" not in str(err.value) and not (tmp_path / "r2").exists()
    mixed = _spec_bench(tmp_path / "mixed.jsonl", 3, 1)
    with open(mixed, "a") as f:
        f.write(json.dumps({"question_id": "b", "category": "lonely", "turns": ["Hello"]}) + "\n")
    with pytest.raises(BenchError, match="test split of .* has none in --category lonely"):
        run_bench(settings(tiny_self_bundle, mixed, tmp_path / "r2", split="test", categories=["lonely"]))


# --------------------------------------------------------------------------- failures: order, clean-up

def test_argument_checks_come_before_any_session(tiny_self_bundle, prompts_file, tmp_path, monkeypatch):
    import edgespec.runtime.api.build as build_module

    def no_session(*a, **k):
        raise AssertionError("a session was created before the arguments were checked")
    monkeypatch.setattr(build_module, "create_sessions", no_session)
    for kw, err, msg in (
            (dict(draft_lengths=[65]), BenchError, "draft-length"),
            (dict(draft_lengths=[2, "auto", "auto"]), BenchError, "twice"),
            (dict(draft_lengths=["fast"]), BenchError, "draft-length"),
            (dict(max_draft_length=0), BenchError, "max_draft_length"),
            (dict(top_p=2.0), GenerationError, "top_p"),
            (dict(top_k=0), GenerationError, "top_k"),
            (dict(strategies=["ar", "tli:nope=1"]), BenchError, "unknown option 'nope'"),
            (dict(strategies=["ar", "ngram:draft_probability=0.5"]), BenchError, "token-level"),
            (dict(strategies=["ar", "tli:draft_confidence=2"]), BenchError, "draft_confidence"),
            (dict(strategies=["ar", "tli:concurrent_draft=maybe"]), BenchError, "concurrent_draft"),
            (dict(strategies=["ar", "ngram:ngram_max_n=0"]), GenerationError, "ngram_max_n"),
            (dict(strategies=["ar", "tli", "rdk"]), GenerationError, "affinity"),
            (dict(strategies=["ar", "sd", "nope"]), GenerationError, "unknown strategy")):
        with pytest.raises(err, match=msg):
            run_bench(settings(tiny_self_bundle, prompts_file, tmp_path / "r", **kw))
        assert not (tmp_path / "r").exists(), kw


def test_failed_bench_removes_only_what_it_created(tiny_self_bundle, prompts_file, tmp_path):
    from edgespec.errors import BundleError

    deep = tmp_path / "new" / "deeper" / "r"
    with pytest.raises(BundleError):
        run_bench(settings(tmp_path / "no-bundle", prompts_file, deep))
    assert not (tmp_path / "new").exists()                          # the parents it made go too
    with pytest.raises(EPError):                                    # fails while creating sessions
        run_bench(settings(tiny_self_bundle, prompts_file, deep, ep="dml"))
    assert not (tmp_path / "new").exists()
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    with pytest.raises(EPError):
        run_bench(settings(tiny_self_bundle, prompts_file, mine, ep="dml"))
    assert sorted(p.name for p in mine.iterdir()) == ["notes.txt"]  # a pre-existing directory and its files stay
    with pytest.raises(BenchError, match="does not exist"):
        run_bench(settings(tiny_self_bundle, prompts_file, tmp_path / "none", resume=True))
    assert not (tmp_path / "none").exists()


# --------------------------------------------------------------------------- real model (CI)

@pytest.mark.real
def test_bench_smollm_self(smollm_self_bundle, tmp_path):
    doc = run_bench(BenchSettings(bundle=smollm_self_bundle, report=tmp_path / "r", prompts="humaneval", split="test",
                                  limit=2, strategies=["ar", "tli"], draft_lengths=[2], max_new_tokens=16, repeats=1,
                                  threads=1, bandwidth_mb=32, progress=False))
    runs = {(r["strategy"], r["draft_length"]): r for r in doc["runs"]}
    tli = runs[("tli", 2)]
    assert tli["acceptance_rate"] > 0.5       # the drafter is the target with a pruned head
    assert close(tli["mbsu_time"], tli["tau"] / (tli["c_time"] * 2 + 1))
    assert close(tli["speedup"], tli["repeats"][0]["ar_total_ms"] / tli["repeats"][0]["total_ms"])
    assert 0 < tli["c_bytes"] < 1.0 and doc["bundle"]["pair"] == "smollm-self"


def test_demo_steps_are_reused_until_inputs_or_outputs_change(tmp_path):
    import subprocess

    from edgespec.profiler.demo import Steps

    made = tmp_path / "made"
    made.write_text("x")
    step = ["models", "list", "--json"]
    quiet = subprocess.DEVNULL
    assert Steps(tmp_path).run("a", step, "key1", [made], stdout=quiet) is True
    assert Steps(tmp_path).run("a", step, "key1", [made], stdout=quiet) is False      # state survives a restart
    assert Steps(tmp_path).run("a", step, "key2", [made], stdout=quiet) is True       # inputs changed
    made.unlink()
    assert Steps(tmp_path).run("a", step, "key2", [made], stdout=quiet) is True       # output gone
    with pytest.raises(BenchError, match="demo step 'b' failed"):
        Steps(tmp_path).run("b", ["models", "pull", "no-such-model", "--quiet"], "k", [], stdout=quiet)


def test_bench_needs_no_torch(tiny_self_bundle, prompts_file, tmp_path):
    import subprocess
    import sys

    code = ("import sys; from edgespec.cli import main; "
            f"rc = main(['bench', '--bundle', {str(tiny_self_bundle)!r}, '--prompts', {str(prompts_file)!r}, "
            "'--split', 'all', '--limit', '1', '--strategies', 'ar,tli', '--draft-length', '2', "
            "'--max-new-tokens', '4', '--repeats', '1', '--threads', '1', '--bandwidth-mb', '0', '--quiet', "
            f"'--report', {str(tmp_path / 'r')!r}]); "
            "assert rc == 0 and 'torch' not in sys.modules, sorted(m for m in sys.modules if 'torch' in m)[:3]")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
