"""The GPU's step path, checked on the CPU EP (issue 47): the graph's own greedy ids (export/greedy_ids.py)
and the static KV layout whose steps a CUDA graph replays (runtime/engine/kv_static.py) compute what the
host argmax and the shared layout compute, bit for bit, and every strategy's greedy output on them is
`ar`'s."""
import numpy as np
import onnx
import pytest

from edgespec.errors import GenerationError
from edgespec.export.greedy_ids import add_greedy_ids, strip_greedy_ids
from edgespec.runtime import Bundle, SpeculativeDecoder
from edgespec.runtime.engine.kv import ModelRunner
from edgespec.runtime.engine.kv_graph import LOGITS_SUM, NEXT_IDS
from edgespec.runtime.engine.kv_static import StaticLayout
from edgespec.runtime.engine.sessions import capture_refused, create_session, with_graph_capture

PROMPTS = ["def quicksort(items):\n    ", "The quick brown fox", "Naïve café owners in Zürich serve"]


def _runner(path, **kw) -> ModelRunner:
    return ModelRunner(create_session(path, "cpu", threads=1, role="target")[0], "target", 2048, **kw)


def _walk(runner, ids, greedy_too: bool = True) -> list[np.ndarray]:
    """A prefill, steps of several widths with a rollback after each, greedy picks between them, and a
    forward past a 64-position static cache."""
    runner.reset()
    out, pos = [runner.forward(ids[:10]).copy()], 10
    for k in (1, 2, 3, 1, 4, 2, 16, 17, 1):
        out.append(runner.forward(ids[pos:pos + k]).copy())
        pos += k - 1
        runner.crop(runner.length - 1)
        if greedy_too:
            out.append(runner.forward(ids[pos:pos + 1], greedy=True).copy())
        else:
            out.append(runner.forward(ids[pos:pos + 1]).copy())
        pos += 1
    out.append(runner.forward(ids[pos:pos + 40]).copy())
    out.append(runner.forward(ids[pos + 40:pos + 42]).copy())
    return out


@pytest.fixture(scope="module")
def walk_ids():
    return np.random.default_rng(0).integers(5, 90, 200).tolist()


def test_the_export_adds_greedy_ids_once_and_strips_them(tiny_same_bundle):
    m = onnx.load(str(Bundle.load(tiny_same_bundle).target.onnx), load_external_data=False)
    outs = [o.name for o in m.graph.output]
    assert NEXT_IDS in outs and LOGITS_SUM in outs          # written by the export (last_logits.edit_file)
    assert not add_greedy_ids(m)
    assert strip_greedy_ids(m) and not strip_greedy_ids(m)
    assert NEXT_IDS not in [o.name for o in m.graph.output]
    assert not any(n.name.startswith("edgespec/greedy_ids/") for n in m.graph.node)
    assert add_greedy_ids(m) and [o.name for o in m.graph.output] == outs


@pytest.mark.parametrize("graph", ["model", "padded"])
def test_graph_argmax_and_static_steps_give_the_shared_layouts_bits(tiny_padded_bundle, walk_ids, graph, capsys):
    t = Bundle.load(tiny_padded_bundle).target
    path = t.onnx if graph == "model" else t.padded_onnx
    base = _walk(_runner(path, graph_argmax=False), walk_ids)
    on_graph = _runner(path, graph_argmax=True)
    assert on_graph.graph_argmax
    for got, want in zip(_walk(on_graph, walk_ids), base):
        np.testing.assert_array_equal(got, want)
    static = _runner(path, graph_argmax=True, static_length=64)
    assert isinstance(static.kv, StaticLayout) and static.kv.capacity == 0
    for got, want in zip(_walk(static, walk_ids), base):
        np.testing.assert_array_equal(got, want)
    assert not static.kv.static and static.kv.capacity > 64        # outgrown: uncaptured from then on
    said = capsys.readouterr().err.strip().splitlines()
    assert len(said) == 1 and "outgrow the 64-position static KV cache" in said[0]
    # min_tokens 2 (padded 1-token steps) through the static buffers: the pad is cropped as before
    padded = [_walk(_runner(path, min_tokens=2, static_length=s, graph_argmax=True), walk_ids) for s in (None, 512)]
    for got, want in zip(*padded):
        np.testing.assert_array_equal(got, want)


def test_a_session_that_captures_compares_each_widths_first_step(tiny_same_bundle, walk_ids, capsys):
    """capture=True on the CPU EP: the run options name graphs (ignored there), and each width's first
    step runs twice and is compared; the results are the shared layout's."""
    path = Bundle.load(tiny_same_bundle).target.onnx
    runner = _runner(path, static_length=512)
    runner.kv = StaticLayout(runner.graph, runner.session, "cpu", 2048, 512, capture=True)
    base = _walk(_runner(path), walk_ids, greedy_too=False)
    for got, want in zip(_walk(runner, walk_ids, greedy_too=False), base):
        np.testing.assert_array_equal(got, want)
    assert runner.kv.capture and runner.kv.checked == {1, 2, 3, 4, 16}       # 17 and 40 run uncaptured
    assert "other bits" not in capsys.readouterr().err


def test_a_graph_without_greedy_ids_argmaxes_on_the_host(tiny_same_bundle, copy_bundle, walk_ids):
    root = copy_bundle(tiny_same_bundle)
    path = root / "target" / "model.onnx"
    m = onnx.load(str(path), load_external_data=False)
    assert strip_greedy_ids(m)
    onnx.save_model(m, str(root / "target" / "old.onnx"))          # beside the same external data
    old = _runner(root / "target" / "old.onnx", graph_argmax=True)
    assert not old.graph.has_greedy_ids and not old.graph_argmax
    for got, want in zip(_walk(old, walk_ids), _walk(_runner(path, graph_argmax=True), walk_ids)):
        np.testing.assert_array_equal(got, want)


def test_nan_logits_are_refused_through_the_graphs_ids(tiny_same_bundle, copy_bundle):
    """The row sums carry a NaN to the host as the logits did: a graph whose logits are NaN is refused
    in one line by greedy forwards on the graph's ids too."""
    root = copy_bundle(tiny_same_bundle)
    m = onnx.load(str(root / "target" / "model.onnx"), load_external_data=False)
    producer = next(n for n in m.graph.node if "logits" in n.output)
    producer.output[list(producer.output).index("logits")] = "raw_logits"
    nan = onnx.helper.make_tensor("nan", onnx.TensorProto.FLOAT, [], [float("nan")])
    m.graph.initializer.append(nan)
    m.graph.node.append(onnx.helper.make_node("Mul", ["raw_logits", "nan"], ["logits"], name="poison"))
    onnx.save_model(m, str(root / "target" / "nan.onnx"))
    for argmax in (True, False):
        runner = _runner(root / "target" / "nan.onnx", graph_argmax=argmax)
        with pytest.raises(GenerationError, match="NaN or inf") as err:
            runner.forward([5, 6, 7], greedy=True)
        assert "\n" not in str(err.value)


@pytest.fixture(scope="module")
def ar_outputs(tiny_same_bundle, tiny_padded_bundle):
    out = {}
    for name, path in (("same", tiny_same_bundle), ("padded", tiny_padded_bundle)):
        dec = SpeculativeDecoder(Bundle.load(path), strategy="ar", threads=1, options={"cuda_graph": "off"})
        out[name] = [dec.generate(p, max_new_tokens=24).token_ids for p in PROMPTS]
    return out


@pytest.mark.parametrize("name", ["same", "padded"])
def test_every_strategy_on_static_steps_and_graph_ids_equals_ar(tiny_same_bundle, tiny_padded_bundle, ar_outputs,
                                                                name):
    b = Bundle.load(tiny_same_bundle if name == "same" else tiny_padded_bundle)
    dec = SpeculativeDecoder(b, strategy="auto", threads=1, options={"cuda_graph": "static"})
    target = dec.shared.target
    assert isinstance(target.kv, StaticLayout) and target.graph.has_greedy_ids
    target.graph_argmax = True              # as off the CPU EP
    for strategy in ("ar", "auto", "ngram", "sd", "tli", "slem", "slrs1"):
        got = [dec.variant(strategy).generate(p, max_new_tokens=24).token_ids for p in PROMPTS]
        assert got == ar_outputs[name], strategy
    assert target.kv.static and target.kv.steps        # the steps ran from the fixed buffers
    assert isinstance(dec.shared.drafter.kv, StaticLayout) and dec.shared.drafter.kv.steps     # the drafter's too


def test_the_cuda_graph_setting_is_checked_in_one_line(tiny_same_bundle):
    with pytest.raises(GenerationError, match="cuda_graph") as err:
        SpeculativeDecoder(Bundle.load(tiny_same_bundle), strategy="ar", threads=1, options={"cuda_graph": "yes"})
    assert "\n" not in str(err.value)
    dec = SpeculativeDecoder(Bundle.load(tiny_same_bundle), strategy="ar", threads=1)
    assert not isinstance(dec.shared.target.kv, StaticLayout)     # auto: only the CUDA EP captures


def test_capture_is_asked_of_the_cuda_ep_alone_and_its_refusal_is_recognised():
    assert with_graph_capture("cpu") == [("CPUExecutionProvider", {})]
    asked = dict(with_graph_capture(["cuda", "cpu"]))
    assert asked["CUDAExecutionProvider"] == {"enable_cuda_graph": "1"} and asked["CPUExecutionProvider"] == {}
    # ORT's words (onnxruntime/core/session/inference_session.cc) when a graph cannot be captured
    assert capture_refused(RuntimeError("This session cannot use the graph capture feature as requested by the user "
                                        "as all compute graph nodes have not been partitioned to the "
                                        "CUDAExecutionProvider"))
    assert not capture_refused(RuntimeError("Failed to load libonnxruntime_providers_cuda.so"))


def test_graph_ids_are_never_shared_by_two_layouts(tiny_same_bundle):
    """ORT replays a captured graph by its id whatever is bound: a layout made again (the load's probes
    make several) must not name another's graphs."""
    runner = _runner(Bundle.load(tiny_same_bundle).target.onnx)
    a, b = (StaticLayout(runner.graph, runner.session, "cpu", 2048, 64, capture=True) for _ in range(2))
    for layout in (a, b):
        layout.run(runner.session, np.array([[5, 6, 7]]), 3, 0)
        layout.run(runner.session, np.array([[8]]), 1, 0)
    ids = lambda layout: {s.run_options.get_run_config_entry("gpu_graph_id") for s in layout.steps.values()}  # noqa: E731
    assert len(ids(a)) == len(ids(b)) == 1 and not ids(a) & ids(b)


def test_a_large_reservation_does_not_end_capture_and_a_reset_brings_it_back(tiny_same_bundle, capsys):
    runner = _runner(Bundle.load(tiny_same_bundle).target.onnx, static_length=64)
    runner.reserve(20)
    assert runner.kv.capacity == 64 and runner.kv.static
    runner.reserve(5000)              # a generation's max_new_tokens it may never reach: nothing moves
    assert runner.kv.capacity == 64 and runner.kv.static and not capsys.readouterr().err
    runner.forward(list(range(5, 75)))                   # 70 positions: outgrown, said once
    assert not runner.kv.static and "outgrow" in capsys.readouterr().err
    base = runner.kv.graph_base
    runner.reset()
    assert runner.kv.static and runner.kv.capacity == 0 and runner.kv.graph_base != base
    runner.forward([5, 6, 7])
    runner.forward([8])
    assert runner.kv.capacity == 64 and runner.kv.steps
