"""GGUF metadata parsed once per conversion, and 4x faster.

A pull reads each GGUF three times: edgespec's tokenizer converter, then transformers' config and
checkpoint loaders (`load_gguf_checkpoint`, which imports `gguf.GGUFReader` at call time). gguf-py's
reader parses the metadata field by field through `np.memmap` slices, whose Python-level
`__getitem__`/`__array_finalize__` dominate on a 151k-token vocabulary: 7.8 s a parse on the
Qwen2.5 GGUFs (this box), 47 s of a pair's pull.

`FastGGUFReader` slices a plain-ndarray view of the same map while it parses the metadata (2.1 s),
and leaves tensors as memmap slices, as the base class does: same fields, parts and tensors
(tests/test_gguf_reader.py checks it against the base reader). `shared_readers()` makes every
`gguf.GGUFReader(path)` in its scope return one such reader per file: a process-wide swap, meant for
one conversion at a time (pulls convert one model after the other). Both rely on gguf-py's private
`_get` and `_build_tensors`; the test fails if a gguf release changes what they parse, and a reader
that raises AttributeError or TypeError (a changed signature) falls back, with a warning, to the base
class.
"""
from __future__ import annotations

import contextlib
import functools
import os
import sys
from pathlib import Path

import numpy as np


@functools.cache
def reader_class():
    from gguf.gguf_reader import GGUFReader  # lazy: the [export] extra; the module's own, never the shared one

    class FastGGUFReader(GGUFReader):
        _plain = None
        _metadata_done = False

        def _get(self, offset, dtype, count=1, override_order=None):
            if self._metadata_done:
                return super()._get(offset, dtype, count, override_order)
            if self._plain is None:
                self._plain = self.data.view(np.ndarray)
            count = int(count)
            arr = self._plain[offset:offset + np.dtype(dtype).itemsize * count].view(dtype=dtype)[:count]
            return arr.view(arr.dtype.newbyteorder(self.byte_order if override_order is None else override_order))

        def _build_tensors(self, start_offs, fields):
            self._metadata_done, self._plain = True, None
            return super()._build_tensors(start_offs, fields)

    return FastGGUFReader


def open_reader(path):
    """A GGUF reader for path: the fast one, or gguf-py's own if the fast one fails on this gguf version."""
    fast = reader_class()
    try:
        return fast(path)
    except (AttributeError, TypeError) as exc:
        print(f"edgespec: warning: the fast GGUF reader does not fit this gguf version ({type(exc).__name__}: "
              f"{exc}); parsing with gguf-py's own reader", file=sys.stderr)
        return fast.__mro__[1](path)


def read(path):
    """The scope's shared reader for path inside `shared_readers()`, else a fresh fast one."""
    import gguf  # lazy: the [export] extra
    shared = gguf.GGUFReader
    return shared(str(path)) if getattr(shared, "edgespec_shared", False) else open_reader(str(path))


@contextlib.contextmanager
def shared_readers():
    """Within this scope, `gguf.GGUFReader(path)` (read mode) returns one shared fast reader per file."""
    import gguf  # lazy: the [export] extra
    base = gguf.GGUFReader
    if getattr(base, "edgespec_shared", False):   # nested: the outer scope shares already
        yield
        return
    cache: dict[tuple, object] = {}

    def shared(path, mode="r"):
        if mode != "r":
            return base(path, mode)
        st = os.stat(path)
        key = (str(Path(path).resolve()), st.st_size, st.st_mtime_ns)
        if key not in cache:
            cache[key] = open_reader(path)
        return cache[key]

    shared.edgespec_shared = True
    gguf.GGUFReader = shared
    try:
        yield
    finally:
        gguf.GGUFReader = base
