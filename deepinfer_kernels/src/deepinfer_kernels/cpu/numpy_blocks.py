"""GGUF block-format weights as numpy arrays, for the torch-free kernel calls (``numpy_ops``).

:class:`BlockRows` is :class:`~deepinfer_kernels.cpu.quant_decoder_layer.BlockMatrix` over a
numpy ``uint8`` array (a view of a memory-mapped file, or a copy): the same rows, the same C
segment table. :class:`LayerDims` and :class:`LayerBlockRows` are a decoder layer's sizes and
projection weights, as ``LayerShape`` and ``LayerBlocks`` are on the torch side.

Example::

    w = BlockRows(raw_bytes, ((QuantType.Q4_1, 576),), cols=576)
    y = NumpyKernels().linear(x, w)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from deepinfer_kernels.quant.formats import BLOCK_GEOMETRY, QuantType, quant_type, row_bytes


def segment_table(layout: tuple[tuple[QuantType, int], ...], cols: int) -> tuple[list[int], int]:
    """The C kernels' segment table of ``layout`` (``n``, then ``(qtype, rows, row_bytes)`` per
    segment, adjacent equal types merged) and the bytes the layout holds; raises ``ValueError``
    naming ``layout`` or ``cols``."""
    if not layout:
        raise ValueError("layout: expected at least one (qtype, rows) segment")
    merged: list[list[int]] = []
    for qtype, rows in layout:
        q = quant_type(qtype, "layout")
        if rows < 0:
            raise ValueError(f"layout: negative row count {rows}")
        size = row_bytes(q, cols)  # raises naming cols when not whole blocks
        if merged and merged[-1][0] == int(q):
            merged[-1][1] += rows
        else:
            merged.append([int(q), rows, size])
    table = [len(merged)] + [v for seg in merged for v in seg]
    return table, sum(rows * size for _, rows, size in merged)


@dataclass(frozen=True)
class BlockRows:
    """A weight ``[rows, cols]`` as raw GGUF rows: ``data`` (C-contiguous ``uint8``, any shape)
    holds ``layout``'s segments one after the other, each ``(qtype, rows)`` rows of ``cols``
    weights in that format. ``segments`` is the C table (int64 ``[1 + 3 n]``: ``n``, then
    ``(qtype, rows, row_bytes)`` per segment, adjacent equal types merged)."""

    data: np.ndarray
    layout: tuple[tuple[QuantType, int], ...]
    cols: int
    segments: np.ndarray = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        table, want = segment_table(self.layout, self.cols)
        d = self.data
        if not isinstance(d, np.ndarray) or d.dtype != np.uint8 or not d.flags.c_contiguous:
            got = d.dtype if isinstance(d, np.ndarray) else type(d).__name__
            raise ValueError(f"data: expected a C-contiguous uint8 numpy array, got {got}")
        if d.size != want:
            raise ValueError(f"data: the layout holds {want} bytes, got {d.size}")
        object.__setattr__(self, "segments", np.array(table, dtype=np.int64))

    @classmethod
    def of(cls, *parts: tuple[np.ndarray, QuantType, int]) -> BlockRows:
        """The row-wise join of ``parts`` (``(bytes [rows, row_bytes], qtype, cols)`` each;
        one copy when there are several)."""
        if not parts:
            raise ValueError("parts: expected at least one (data, qtype, cols)")
        cols = parts[0][2]
        if any(c != cols for _, _, c in parts):
            raise ValueError(f"parts: every part must have {cols} columns")
        layout = []
        for data, qtype, _ in parts:
            q = quant_type(qtype, "parts")
            size = row_bytes(q, cols)
            if data.size % size:
                raise ValueError(f"parts: {data.size} bytes are not whole {q.name} rows of {cols}")
            layout.append((q, data.size // size))
        flat = [np.ascontiguousarray(d).reshape(-1) for d, _, _ in parts]
        joined = flat[0] if len(flat) == 1 else np.concatenate(flat)
        return cls(joined, tuple(layout), cols)

    @property
    def rows(self) -> int:
        return sum(rows for _, rows in self.layout)

    @property
    def nbytes(self) -> int:
        return int(self.data.size)

    def parts(self) -> list[tuple[np.ndarray, QuantType]]:
        """The segments as ``(bytes [rows, row_bytes], qtype)`` views of :attr:`data`."""
        out, start, flat = [], 0, self.data.reshape(-1)
        for qtype, rows in self.layout:
            size = row_bytes(qtype, self.cols)
            out.append((flat[start : start + rows * size].reshape(rows, size), qtype))
            start += rows * size
        return out


def block_cols(qtype: int | QuantType, row_size: int) -> int:
    """Weights in a row of ``row_size`` bytes of ``qtype`` (the inverse of ``row_bytes``)."""
    q = quant_type(qtype)
    block, size = BLOCK_GEOMETRY[q]
    if row_size <= 0 or row_size % size:
        raise ValueError(
            f"row_size: {q.name} rows are whole blocks of {size} bytes, got {row_size}"
        )
    return row_size // size * block


@dataclass(frozen=True)
class LayerDims:
    """A Llama decoder layer's sizes (``LayerShape`` on the torch side)."""

    hidden: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate: int

    def __post_init__(self) -> None:
        for name in ("hidden", "num_heads", "num_kv_heads", "head_dim", "intermediate"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}: expected an int >= 1, got {value!r}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads: {self.num_heads} is not a multiple of num_kv_heads {self.num_kv_heads}"
            )

    @property
    def qkv_width(self) -> int:
        return (self.num_heads + 2 * self.num_kv_heads) * self.head_dim

    @property
    def q_width(self) -> int:
        return self.num_heads * self.head_dim

    def scratch_size(self, rows: int) -> int:
        """Floats of scratch the MLP half needs for ``rows`` rows."""
        return rows * (2 * self.hidden + 3 * self.intermediate)


@dataclass(frozen=True)
class LayerBlockRows:
    """One decoder layer's projections as :class:`BlockRows` (QKV and gate/up joined
    row-wise), checked against ``dims``; ``qkv_bias`` fp32 ``[qkv_width]`` or None."""

    dims: LayerDims
    qkv: BlockRows
    qkv_bias: np.ndarray | None
    o: BlockRows
    gate_up: BlockRows
    down: BlockRows

    def __post_init__(self) -> None:
        d = self.dims
        want = {
            "qkv": (d.qkv_width, d.hidden),
            "o": (d.hidden, d.q_width),
            "gate_up": (2 * d.intermediate, d.hidden),
            "down": (d.hidden, d.intermediate),
        }
        for name, dims in want.items():
            m = getattr(self, name)
            if not isinstance(m, BlockRows) or (m.rows, m.cols) != dims:
                got = (m.rows, m.cols) if isinstance(m, BlockRows) else type(m).__name__
                raise ValueError(f"{name}: expected BlockRows {dims}, got {got}")
        bias = self.qkv_bias
        if bias is not None:
            check_array("qkv_bias", bias, np.float32, (d.qkv_width,))


def check_array(
    name: str, a: object, dtype: type | np.dtype, shape: Sequence[int | None]
) -> np.ndarray:
    """``a`` when it is a C-contiguous numpy array of ``dtype`` and ``shape`` (None: any
    size there), else a ``ValueError`` naming ``name``."""
    want = "x".join("*" if s is None else str(s) for s in shape)
    if not isinstance(a, np.ndarray):
        raise ValueError(f"{name}: expected a numpy array, got {type(a).__name__}")
    if (
        a.dtype != dtype
        or a.ndim != len(shape)
        or any(s is not None and n != s for n, s in zip(a.shape, shape))
        or not a.flags.c_contiguous
    ):
        raise ValueError(
            f"{name}: expected a C-contiguous {np.dtype(dtype).name} array [{want}], got "
            f"{a.dtype} {list(a.shape)}{'' if a.flags.c_contiguous else ' (not contiguous)'}"
        )
    return a
