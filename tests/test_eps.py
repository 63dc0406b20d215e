"""Execution providers: names, the 'is it really active' check, fallback, noise, thread options."""
import os
import subprocess
import sys
import warnings

import pytest

from edgespec.errors import EPError
from edgespec.runtime import SpeculativeDecoder
from edgespec.runtime.engine.sessions import create_session, resolve_providers, session_options


def test_resolve_names_aliases_and_lists():
    assert resolve_providers("cpu") == [("CPUExecutionProvider", {})]
    assert resolve_providers("CUDA") == [("CUDAExecutionProvider", {})]
    assert resolve_providers(None) == [("CPUExecutionProvider", {})]
    for alias in ("tensorrt", "dml", "qnn", "openvino", "coreml", "rocm"):
        assert resolve_providers(alias)[0][0].endswith("ExecutionProvider")
    got = resolve_providers([("CUDAExecutionProvider", {"device_id": 0}), "cpu"])
    assert got == [("CUDAExecutionProvider", {"device_id": 0}), ("CPUExecutionProvider", {})]


@pytest.mark.parametrize("bad", ["npu", "FooExecutionProvider", [], [42]])
def test_unknown_ep_is_refused(bad):
    with pytest.raises(EPError):
        resolve_providers(bad)


def test_unknown_ep_names_the_choices():
    with pytest.raises(EPError, match="cuda.*openvino"):
        resolve_providers("npu")


def _session_or_skip(path, ep):
    """Skip where the EP genuinely works (a GPU machine): the test is about an inactive EP."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sess, info = create_session(path, ep, threads=1, allow_fallback=True)
    if info.fallback is None:
        pytest.skip(f"{ep} is really active on this machine")
    return info


def test_inactive_cuda_raises_naming_what_is_active(tiny_self_bundle):
    onnx = tiny_self_bundle / "target" / "model.onnx"
    _session_or_skip(onnx, "cuda")
    with pytest.raises(EPError, match="CUDAExecutionProvider is not active.*runs on CPUExecutionProvider"):
        create_session(onnx, "cuda", threads=1)


def test_cuda_load_noise_is_hidden(tiny_self_bundle):
    """ORT logs the failed CUDA library load only on the first attempt in a process: use a fresh one."""
    _session_or_skip(tiny_self_bundle / "target" / "model.onnx", "cuda")
    code = ("from edgespec.runtime.engine.sessions import create_session\n"
            "try:\n    create_session(%r, 'cuda', threads=1)\nexcept Exception as e:\n    print(type(e).__name__)\n"
            % str(tiny_self_bundle / "target" / "model.onnx"))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert out.stdout.strip() == "EPError"
    assert "Failed to load library" not in out.stderr and "Failed to create CUDAExecutionProvider" not in out.stderr


def test_allow_fallback_warns_and_records(tiny_self_bundle):
    _session_or_skip(tiny_self_bundle / "target" / "model.onnx", "cuda")
    with pytest.raises(EPError, match="allow_fallback"):
        SpeculativeDecoder(tiny_self_bundle, strategy="tli", ep="cuda", threads=1)
    with pytest.warns(RuntimeWarning, match="falling back"):
        dec = SpeculativeDecoder(tiny_self_bundle, strategy="tli", ep="cuda", threads=1, allow_fallback=True)
    st = dec.generate("hello", max_new_tokens=3).stats
    assert st.fallbacks == ["target: CUDAExecutionProvider -> CPUExecutionProvider",
                            "drafter: CUDAExecutionProvider -> CPUExecutionProvider"]
    assert st.providers == {"target": ["CPUExecutionProvider"], "drafter": ["CPUExecutionProvider"]}


def test_draft_ep_can_differ(tiny_self_bundle):
    _session_or_skip(tiny_self_bundle / "target" / "model.onnx", "cuda")
    with pytest.warns(RuntimeWarning):
        dec = SpeculativeDecoder(tiny_self_bundle, strategy="tli", ep="cpu", threads=1,
                                 allow_fallback=True, options={"draft_ep": "cuda"})
    assert dec.shared.target_session_info.fallback is None
    assert dec.drafter_session_info.requested[0] == "CUDAExecutionProvider"
    st = dec.generate("hello", max_new_tokens=2).stats
    assert st.fallbacks == ["drafter: CUDAExecutionProvider -> CPUExecutionProvider"]


def test_unknown_ep_in_decoder(tiny_self_bundle):
    with pytest.raises(EPError, match="unknown execution provider"):
        SpeculativeDecoder(tiny_self_bundle, ep="npu")


def test_thread_options():
    from edgespec.runtime.engine.sessions import allowed_cores

    if allowed_cores() < 2:
        pytest.skip("one allowed core: 2 threads are capped to 1, which sets no spinning options")
    so = session_options(2)
    assert so.intra_op_num_threads == 2
    # threads spin during a run and stop when it returns (no stealing from the other session)
    assert so.get_session_config_entry("session.intra_op.allow_spinning") == "1"
    assert so.get_session_config_entry("session.force_spinning_stop") == "1"
    # the target's keep spinning after a run: its next plain step starts on awake threads
    assert session_options(2, stop_spinning=False).get_session_config_entry("session.force_spinning_stop") == "0"
    assert session_options(1).intra_op_num_threads == 1
    with pytest.raises(EPError):
        session_options(0)


@pytest.mark.parametrize("bad", [2.7, 0, -1, "2", True, 10**12, float("nan"), [2]])
def test_bad_threads_are_one_line_errors(tiny_self_bundle, bad):
    """threads must be a whole number from 1 to MAX_THREADS: floats are refused, not truncated."""
    with pytest.raises(EPError, match="threads must be a whole number") as exc:
        session_options(bad)
    assert "\n" not in str(exc.value)
    with pytest.raises(EPError, match="drafter threads must be a whole number"):
        create_session(tiny_self_bundle / "drafter" / "model.onnx", "cpu", threads=bad, role="drafter")


@pytest.mark.parametrize("kw", [{"threads": 2.7}, {"threads": 0}, {"threads": "2"},
                                {"options": {"draft_threads": -1}}, {"options": {"draft_threads": 1.5}}])
def test_bad_threads_in_the_decoder(tiny_self_bundle, kw):
    with pytest.raises(EPError, match="threads must be a whole number") as exc:
        SpeculativeDecoder(tiny_self_bundle, strategy="tli", **{"threads": 1, **kw})
    assert "\n" not in str(exc.value)


def test_good_threads():
    import numpy as np

    from edgespec.runtime.engine.sessions import allowed_cores

    assert session_options(np.int64(1)).intra_op_num_threads == 1
    assert session_options(np.int64(3)).intra_op_num_threads == min(3, allowed_cores())    # capped to the cores
    assert session_options(None).intra_op_num_threads == allowed_cores()


def test_ep_missing_from_the_build_is_a_one_line_error(tiny_self_bundle, capfd):
    """An EP this onnxruntime build does not have: refused before ORT warns or prints about it."""
    import onnxruntime as ort

    missing = next((n for n in ("QNNExecutionProvider", "CoreMLExecutionProvider", "DmlExecutionProvider")
                    if n not in ort.get_available_providers()), None)
    if missing is None:
        pytest.skip("every candidate EP is in this build")
    onnx = tiny_self_bundle / "target" / "model.onnx"
    capfd.readouterr()
    with pytest.raises(EPError, match=f"{missing} is not in this onnxruntime build.*allow_fallback") as exc:
        create_session(onnx, missing, threads=1, role="target")
    assert "\n" not in str(exc.value)
    with pytest.warns(RuntimeWarning, match="falling back"):
        _, info = create_session(onnx, [missing, "cpu"], threads=1, allow_fallback=True)
    assert info.active == ["CPUExecutionProvider"] and info.fallback
    cap = capfd.readouterr()
    assert "EP Error" not in cap.out and "not in available provider names" not in cap.err


def test_unloadable_graph_is_a_bundle_error(tmp_path):
    from edgespec.errors import BundleError

    bad = tmp_path / "model.onnx"
    bad.write_bytes(b"not a graph")
    with pytest.raises(BundleError, match="ONNX Runtime cannot load") as exc:
        create_session(bad, "cpu", threads=1)
    assert "\n" not in str(exc.value)


def test_pair_sessions_build_together_and_report_the_failing_one(tiny_same_bundle, tmp_path):
    """create_sessions: the CPU pair is built concurrently, in request order, with the same errors as
    create_session (the failing request's role in a one-line message)."""
    from edgespec.errors import BundleError
    from edgespec.runtime.engine.sessions import create_sessions

    good = tiny_same_bundle / "target" / "model.onnx"
    bad = tmp_path / "model.onnx"
    bad.write_bytes(b"not a graph")
    (t, ti), (d, di) = create_sessions([dict(model_path=good, threads=1, role="target"),
                                        dict(model_path=tiny_same_bundle / "drafter" / "model.onnx", threads=1,
                                             role="drafter")])
    assert t._model_path.endswith("target/model.onnx") and d._model_path.endswith("drafter/model.onnx")
    with pytest.raises(BundleError, match="drafter: ONNX Runtime cannot load") as exc:
        create_sessions([dict(model_path=good, threads=1, role="target"),
                         dict(model_path=bad, threads=1, role="drafter")])
    assert "\n" not in str(exc.value)
