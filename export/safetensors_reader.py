"""A safetensors reader that copies each tensor with a plain read instead of memory-mapping the file.

transformers (4.57) loads a checkpoint through `safetensors.safe_open`, which maps each shard: every
page of the shard it touches stays resident, and counted in the process's RSS, until the mapping is
closed. Loading Qwen2.5-Coder-1.5B in fp32 for the model builder therefore showed 7 GB of mapped shard
pages on top of the 7-8 GB of copied weights (15 GB RSS for a moment, 8 GB of it anonymous).
`PlainReader` offers the part of safe_open's interface transformers uses (`keys`, `metadata`,
`get_tensor`, `get_slice(...).get_dtype() / get_shape() / [...]`) and reads one tensor at a time into
a fresh torch tensor: the same values, no mapping. export/builder_child.py installs it in
transformers.modeling_utils for the builder's child process only.
"""
from __future__ import annotations

import json
import struct
from pathlib import Path

# safetensors dtype names -> torch dtype names (those a language model checkpoint holds)
_TORCH_DTYPES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16", "I64": "int64",
                 "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8", "BOOL": "bool"}


class PlainReader:
    def __init__(self, filename, framework: str = "pt", device="cpu"):
        if framework not in ("pt", "torch"):
            raise ValueError(f"PlainReader reads torch tensors only, not {framework!r}")
        self.path = Path(filename)
        with open(self.path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(n))
        self._metadata = header.pop("__metadata__", None)
        self._header = header
        self._base = 8 + n
        self.device = device

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> bool:
        return False

    def keys(self) -> list[str]:
        return sorted(self._header)

    def metadata(self):
        return self._metadata

    def get_tensor(self, name: str):
        import torch  # lazy: [export] extra; only the builder child reads checkpoints this way

        info = self._header[name]
        dtype = getattr(torch, _TORCH_DTYPES[info["dtype"]])
        start, end = info["data_offsets"]
        out = torch.empty(info["shape"], dtype=dtype)
        if end > start:
            view = out.view(-1).view(torch.uint8).numpy()
            with open(self.path, "rb") as f:
                f.seek(self._base + start)
                if f.readinto(view) != end - start:
                    raise OSError(f"{self.path}: tensor {name} is truncated")
        return out if self.device in ("cpu", None) else out.to(self.device)

    def get_slice(self, name: str) -> "_Slice":
        return _Slice(self, name)


class _Slice:
    def __init__(self, reader: PlainReader, name: str):
        self.reader, self.name = reader, name

    def get_dtype(self) -> str:
        return self.reader._header[self.name]["dtype"]

    def get_shape(self) -> list[int]:
        return list(self.reader._header[self.name]["shape"])

    def __getitem__(self, index):
        tensor = self.reader.get_tensor(self.name)
        return tensor if index is Ellipsis else tensor[index]
