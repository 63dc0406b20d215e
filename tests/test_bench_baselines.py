"""bench's honest baselines on the tiny bundles: ar-fast as the speed baseline where the graph pads
1-token steps, decode-rate and end-to-end speedups against it, and onnxruntime-genai as a peer row."""
from __future__ import annotations

import json
import os
import sys
import tempfile

import pytest

from edgespec.cli import main
from edgespec.export.workdirs import host_tag
from edgespec.profiler import bench as B
from edgespec.profiler.aggregate import repeat_summary
from edgespec.profiler.peer_llama import LlamaServerPeer, PeerError, target_gguf
from edgespec.profiler.settings import FAST_BASELINE
from edgespec.runtime.bundle.bundle import Bundle
from edgespec.runtime.api.decoder import SpeculativeDecoder


@pytest.fixture
def prompts_file(tmp_path):
    p = tmp_path / "p.jsonl"
    rows = [{"question_id": f"q{i}", "category": c, "turns": [t]} for i, (c, t) in enumerate(
        [("code", "def quicksort(items):\n    "), ("prose", "The quick brown fox"), ("code", "class Counter:\n")])]
    p.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return p


def _bench(bundle, prompts, out, *extra):
    argv = ["bench", "--bundle", str(bundle), "--prompts", str(prompts), "--max-new-tokens", "8", "--repeats", "1",
            "--no-warmup", "--threads", "1", "--bandwidth-mb", "0", "--quiet", "--report", str(out), *extra]
    assert main(argv) == 0
    return json.loads((out / "report.json").read_text())


def test_onnxruntime_genai_is_a_row_of_the_report(tiny_same_bundle, prompts_file, tmp_path, capsys, monkeypatch):
    pytest.importorskip("onnxruntime_genai")
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    killed = scratch / f"edgespec-peer-{2**31 - 2}.{host_tag()}-x1"      # a killed bench's (no such process)
    killed.mkdir()
    doc = _bench(tiny_same_bundle, prompts_file, tmp_path / "r", "--strategies", "ar,tli", "--draft-length", "2",
                 "--peers")
    runs = {r["strategy"]: r for r in doc["runs"]}
    assert list(runs) == ["ar", "tli", "onnxruntime-genai"]
    peer = runs["onnxruntime-genai"]
    # the peer runs the graph edgespec's ar runs (fp32 here: one kernel path), so the greedy tokens agree
    assert peer["outputs_differing_from_ar"] == 0 and peer["compared_with"] == "ar"
    assert peer["ttft_ms"] > 0 and peer["decode_tokens_per_s"] > 0 and peer["speedup"] > 0
    assert runs["ar"]["speedup"] == pytest.approx(1.0) and runs["ar"]["decode_speedup"] == pytest.approx(1.0)
    assert "onnxruntime-genai" in (tmp_path / "r" / "report.md").read_text()
    assert list(scratch.iterdir()) == []       # the peer's scratch directory removed, and the killed one's


def test_peers_without_onnxruntime_genai_is_one_line_and_the_bench_runs(tiny_same_bundle, prompts_file, tmp_path,
                                                                         monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "onnxruntime_genai", None)          # as if not installed: import fails
    doc = _bench(tiny_same_bundle, prompts_file, tmp_path / "r", "--strategies", "ar", "--peers")
    assert [r["strategy"] for r in doc["runs"]] == ["ar"]
    err = [line for line in capsys.readouterr().err.splitlines() if "--peers" in line]
    assert len(err) == 1 and "not installed" in err[0]


def test_a_padded_graph_is_benched_against_ar_fast(tiny_same_bundle, prompts_file, tmp_path, monkeypatch):
    family = B.decoder_family

    def padded(bundle, configs, s):          # as an int4 graph whose 1-token kernel path differs declares
        out = family(bundle, configs, s)
        out[("ar", 0)].target.min_tokens = 2
        return out
    monkeypatch.setattr(B, "decoder_family", padded)
    doc = _bench(tiny_same_bundle, prompts_file, tmp_path / "r", "--strategies", "ar,tli", "--draft-length", "2")
    runs = {(r["strategy"], r["draft_length_setting"]): r for r in doc["runs"]}
    assert list(runs) == [("ar", 0), FAST_BASELINE, ("tli", 2)]
    assert runs[FAST_BASELINE]["speedup"] == pytest.approx(1.0)          # the baseline is ar-fast ...
    assert runs[("tli", 2)]["outputs_differing_from_ar"] == 0            # ... the lossless reference is ar
    assert runs[("tli", 2)]["compared_with"] == "ar" and runs[FAST_BASELINE]["compared_with"] == "ar"
    recs = [json.loads(line) for line in (tmp_path / "r" / "records.jsonl").read_text().splitlines()[1:]]
    fast = [r for r in recs if r["strategy"] == "ar-fast"]
    exact = [r for r in recs if r["strategy"] == "ar"]
    assert fast and all(r["verify_forwards"] == r["new_tokens"] - 1 for r in fast)
    assert [r["output_sha256"] for r in fast] == [r["output_sha256"] for r in exact]   # fp32: same function


def test_speedups_by_hand():
    """Two generations of 11 tokens: TTFT 100 ms, decode 10 tokens in 500 ms (the baseline: 1000 ms)."""
    rec = {"new_tokens": 11, "total_ms": 600.0, "ttft_ms": 100.0, "prefill_tokens": 1, "drafted": 8, "accepted": 6,
           "verify_forwards": 4, "target_forwards": 5, "draft_forwards": 8, "peak_rss_mb": 1.0, "prefill_ms": 90.0,
           "draft_ms": 100.0, "verify_ms": 380.0, "overhead_ms": 30.0, "sampler_ms": 1.0, "draft_prefill_ms": 20.0}
    base = {**rec, "total_ms": 1100.0, "drafted": 0, "accepted": 0, "verify_forwards": 10, "draft_ms": 0.0,
            "draft_prefill_ms": 0.0}
    s = repeat_summary([rec, rec], [base, base], 2, {})
    assert s["decode_tokens_per_s"] == pytest.approx(20.0)               # 10 tokens / 0.5 s
    assert s["decode_speedup"] == pytest.approx(2.0)                     # 20 vs 10 tok/s
    assert s["speedup"] == pytest.approx(1100 / 600)                     # 11 tokens in 0.6 s vs 1.1 s
    assert s["ttft_ratio"] == pytest.approx(1.0) and s["draft_prefill_ms"] == pytest.approx(20.0)


def test_llama_server_that_cannot_run_is_one_line_and_the_bench_runs(tiny_same_bundle, prompts_file, tmp_path,
                                                                      capsys):
    """The tiny bundle's target is no recipe's, so there is no GGUF for llama.cpp: one line, no row."""
    doc = _bench(tiny_same_bundle, prompts_file, tmp_path / "r", "--strategies", "ar", "--llama-server", "/bin/true")
    assert [r["strategy"] for r in doc["runs"]] == ["ar"]
    err = [line for line in capsys.readouterr().err.splitlines() if "llama.cpp" in line]
    assert len(err) == 1 and "not from a model recipe" in err[0] and err[0].startswith("edgespec: --llama-server:")


@pytest.mark.parametrize("binary, why", [("/nonexistent/llama-server", "is not a file"),
                                         ("/bin/false", "llama-server exited with 1"),
                                         ("/etc/hostname", "does not run here")])
def test_a_llama_server_that_does_not_start_says_why(tmp_path, binary, why):
    with pytest.raises(PeerError, match=why):
        LlamaServerPeer(binary, tmp_path / "model.gguf", threads=1)


@pytest.mark.long
@pytest.mark.real
def test_llama_cpp_is_a_row_of_the_report(smollm_self_bundle, prompts_file, tmp_path):
    """By hand ($EDGESPEC_LLAMA_SERVER: a llama-server build): llama.cpp's plain decoding of SmolLM2's own
    GGUF on the bench's prompt ids. Its Q4_1 kernels are not the bundle's fp32 graph (their greedy code
    drifts apart within a few tokens), but a clear-cut answer after the same prompt ids agrees."""
    binary = os.environ.get("EDGESPEC_LLAMA_SERVER")
    if not binary:
        pytest.skip("no llama-server binary ($EDGESPEC_LLAMA_SERVER unset)")
    doc = _bench(smollm_self_bundle, prompts_file, tmp_path / "r", "--strategies", "ar", "--llama-server", binary)
    runs = {r["strategy"]: r for r in doc["runs"]}
    assert list(runs) == ["ar", "llama.cpp"]
    row = runs["llama.cpp"]
    assert row["decode_tokens_per_s"] > 0 and row["ttft_ms"] > 0 and row["compared_with"] == "ar"
    assert row["providers"]["target"][0].startswith("llama.cpp")
    dec = SpeculativeDecoder(smollm_self_bundle, strategy="ar", threads=1)
    peer = LlamaServerPeer(binary, target_gguf(Bundle.load(smollm_self_bundle)), threads=1)
    try:
        ids = dec.encode_prompt("The capital of France is")
        ours, theirs = dec.generate(ids, max_new_tokens=4).token_ids, peer.generate(ids, max_new_tokens=4)
        assert theirs.token_ids == ours and theirs.prompt_token_ids == ids       # " Paris.\n\n" in both
    finally:
        peer.close()
    assert peer.proc.poll() is not None                 # the server is gone
