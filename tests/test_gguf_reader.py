"""models/gguf_reader.py: the fast reader parses exactly what gguf-py's reader parses, and a
conversion's three reads of one GGUF share one parse."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

from edgespec.models import get_model  # noqa: E402
from edgespec.models import gguf_reader  # noqa: E402
from edgespec.models.weights import assemble_gguf  # noqa: E402
from gguf.gguf_reader import GGUFReader  # noqa: E402


def write_small_gguf(path: Path) -> Path:
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("tiny")
    w.add_context_length(64)
    w.add_tokenizer_model("gpt2")
    w.add_token_list(["a", "b", "\u00e9t\u00e9", "", "<|end|>"])
    w.add_token_types([1, 1, 1, 1, 3])
    w.add_token_merges(["a b", "\u00e9 t"])
    w.add_token_scores([0.0, -1.5, -2.0, -3.0, 0.0])
    w.add_tensor("w.f32", np.arange(24, dtype=np.float32).reshape(4, 6))
    w.add_tensor("w.f16", np.linspace(-1, 1, 32, dtype=np.float16).reshape(2, 16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def assert_same_parse(fast, base) -> None:
    assert list(fast.fields) == list(base.fields)
    for name, a in fast.fields.items():
        b = base.fields[name]
        assert (a.offset, a.data, a.types, len(a.parts)) == (b.offset, b.data, b.types, len(b.parts)), name
        for pa, pb in zip(a.parts, b.parts):
            assert pa.dtype == pb.dtype and np.array_equal(pa, pb), name
        assert a.contents() == b.contents(), name
    assert [t.name for t in fast.tensors] == [t.name for t in base.tensors]
    for a, b in zip(fast.tensors, base.tensors):
        assert (a.tensor_type, a.data_offset, a.n_bytes) == (b.tensor_type, b.data_offset, b.n_bytes)
        assert type(a.data) is type(b.data) and a.data.dtype == b.data.dtype and np.array_equal(a.data, b.data)
    assert fast.data_offset == base.data_offset


def test_fast_reader_parses_what_gguf_py_parses(tmp_path):
    path = write_small_gguf(tmp_path / "tiny.gguf")
    fast = gguf_reader.open_reader(str(path))
    assert type(fast) is gguf_reader.reader_class() and fast._metadata_done
    assert_same_parse(fast, GGUFReader(str(path)))
    assert fast.fields["tokenizer.ggml.tokens"].contents()[2] == "\u00e9t\u00e9"


def test_fast_reader_refuses_a_bad_file_as_the_base_does(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUX" + bytes(60))
    with pytest.raises(ValueError, match="magic"):
        gguf_reader.reader_class()(str(bad))


def test_shared_readers_parse_each_file_once_and_restore_the_class(tmp_path):
    one = write_small_gguf(tmp_path / "one.gguf")
    two = write_small_gguf(tmp_path / "two.gguf")
    with gguf_reader.shared_readers():
        from gguf import GGUFReader as patched   # what transformers' loader imports at call time
        first = patched(str(one))
        assert patched(one) is first and gguf_reader.read(one) is first
        assert patched(str(two)) is not first
        with gguf_reader.shared_readers():       # nested: still the outer scope's cache
            assert gguf.GGUFReader(str(one)) is first
        assert gguf.GGUFReader(str(one)) is first
    assert gguf.GGUFReader is GGUFReader
    assert gguf_reader.read(one) is not first    # outside a scope: a fresh parse


def test_shared_readers_restore_the_class_after_an_error(tmp_path):
    with pytest.raises(RuntimeError):
        with gguf_reader.shared_readers():
            raise RuntimeError("conversion failed")
    assert gguf.GGUFReader is GGUFReader


@pytest.mark.real
def test_fast_reader_on_smollm2s_gguf():
    path = str(assemble_gguf(get_model("smollm2-135m"), progress=False))
    assert_same_parse(gguf_reader.open_reader(path), GGUFReader(path))
