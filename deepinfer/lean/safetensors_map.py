"""A safetensors file as numpy views of one read-only memory map (no copy, no torch).

The engine keeps a GGUF model's tensors in ``gguf-blocks.st`` (``deepinfer.models.gguf_model``):
safetensors, the block bytes as uint8. ``safetensors``' numpy loader copies every tensor out of
the file; the lean runtime maps the file once and hands out views, so each weight is in memory
once, as file pages the kernel touches (as llama.cpp's ``mmap`` loading does). The format is
an 8-byte little-endian header length, a JSON header (``{name: {dtype, shape, data_offsets}}``
and ``__metadata__``), then the data; anything that does not parse or does not fit the file is
a :class:`ValueError`, and the caller treats the file as missing.
"""

from __future__ import annotations

import json
import os
import struct
from typing import Any

import numpy as np

_DTYPES = {"U8": np.uint8, "I8": np.int8, "F16": np.float16, "F32": np.float32,
           "I32": np.int32, "I64": np.int64, "F64": np.float64}  # fmt: skip
# A header larger than this is not one deepinfer wrote (the spec caps it at 100 MB too).
_MAX_HEADER = 100_000_000


class SafetensorsMap:
    """The tensors of ``path`` as numpy views of a read-only memory map.

    Example::

        st = SafetensorsMap("gguf-blocks.st")
        meta, names = st.metadata, st.names()
        w = st.array("model.norm.weight")  # float32 view, no copy
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        size = os.path.getsize(path)
        if size < 8:
            raise ValueError(f"{os.fspath(path)!r}: not a safetensors file (too short)")
        self._map = np.memmap(path, dtype=np.uint8, mode="r")
        (length,) = struct.unpack("<Q", bytes(self._map[:8]))
        if length > min(_MAX_HEADER, size - 8):
            raise ValueError(f"{os.fspath(path)!r}: header length {length} does not fit the file")
        try:
            header: dict[str, Any] = json.loads(bytes(self._map[8 : 8 + length]))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ValueError(f"{os.fspath(path)!r}: unreadable header: {exc}") from exc
        if not isinstance(header, dict):
            raise ValueError(f"{os.fspath(path)!r}: the header is not a JSON object")
        meta = header.pop("__metadata__", None) or {}
        self.metadata: dict[str, str] = {str(k): str(v) for k, v in meta.items()}
        self._start = 8 + length
        self._entries: dict[str, tuple[type, tuple[int, ...], int, int]] = {}
        data = size - self._start
        for name, entry in header.items():
            try:
                dtype = _DTYPES[entry["dtype"]]
                shape = tuple(int(d) for d in entry["shape"])
                begin, end = (int(v) for v in entry["data_offsets"])
            except (KeyError, TypeError, ValueError) as exc:
                raise ValueError(f"{name}: unreadable header entry {entry!r}") from exc
            count = int(np.prod(shape, dtype=np.int64)) if shape else 1
            if not 0 <= begin <= end <= data or end - begin != count * np.dtype(dtype).itemsize:
                raise ValueError(f"{name}: data offsets {begin}..{end} do not fit its shape")
            self._entries[name] = (dtype, shape, begin, end)

    def names(self) -> list[str]:
        return list(self._entries)

    def array(self, name: str) -> np.ndarray:
        """Tensor ``name`` as a read-only view of the map (``KeyError`` when absent)."""
        dtype, shape, begin, end = self._entries[name]
        flat = self._map[self._start + begin : self._start + end]
        # A plain ndarray view (not an np.memmap subclass): arithmetic on it makes arrays.
        return (
            np.ndarray(shape, dtype=dtype, buffer=flat, offset=0)
            if end > begin
            else (np.zeros(shape, dtype=dtype))
        )
