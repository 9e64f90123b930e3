"""GGUF tensor formats kept as their raw blocks: type ids, block geometry, a weight container.

The numbers are llama.cpp's (``ggml.h`` / ``GGML_QUANT_SIZES`` of the ``gguf`` package, which
the tests check them against); this package does not import ``gguf`` at run time. A row of
``cols`` weights in a block format is ``cols / block_size`` blocks of ``type_size`` bytes, and
rows are independent, so a matrix ``[rows, cols]`` is a uint8 tensor ``[rows, row_bytes]``:
selecting, permuting or concatenating rows works on the raw bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported where a QuantWeight is built: the format table needs no torch
    import torch

QK_K = 256  # elements per super-block of the k-quants


class QuantType(IntEnum):
    """GGML tensor type ids (``gguf.GGMLQuantizationType`` values) this package runs."""

    F32 = 0
    F16 = 1
    Q4_0 = 2
    Q4_1 = 3
    Q8_0 = 8
    Q4_K = 12
    Q5_K = 13
    Q6_K = 14
    BF16 = 30


# (elements per block, bytes per block)
BLOCK_GEOMETRY: dict[QuantType, tuple[int, int]] = {
    QuantType.F32: (1, 4),
    QuantType.F16: (1, 2),
    QuantType.BF16: (1, 2),
    QuantType.Q4_0: (32, 2 + 16),
    QuantType.Q4_1: (32, 2 + 2 + 16),
    QuantType.Q8_0: (32, 2 + 32),
    QuantType.Q4_K: (QK_K, 2 + 2 + 12 + QK_K // 2),
    QuantType.Q5_K: (QK_K, 2 + 2 + 12 + QK_K // 8 + QK_K // 2),
    QuantType.Q6_K: (QK_K, QK_K // 2 + QK_K // 4 + QK_K // 16 + 2),
}


def quant_type(value: int | QuantType, name: str = "qtype") -> QuantType:
    """``value`` as a :class:`QuantType`, or a ``ValueError`` naming ``name`` and the types."""
    try:
        return QuantType(int(value))
    except (ValueError, TypeError):
        known = ", ".join(f"{t.name}={t.value}" for t in QuantType)
        raise ValueError(
            f"{name}: GGML type {value!r} is not supported (supported: {known})"
        ) from None


def row_bytes(qtype: int | QuantType, cols: int) -> int:
    """Bytes of one row of ``cols`` weights; ``cols`` must be a whole number of blocks."""
    block, size = BLOCK_GEOMETRY[quant_type(qtype)]
    if cols <= 0 or cols % block:
        raise ValueError(
            f"cols: {QuantType(qtype).name} rows hold whole blocks of {block}, got {cols}"
        )
    return cols // block * size


@dataclass(frozen=True)
class QuantWeight:
    """A weight matrix ``[rows, cols]`` held in a GGUF block format.

    ``data``: uint8 ``[rows, row_bytes(qtype, cols)]``, the file's bytes (contiguous, any
    device). Dequantising gives exactly ``gguf.quants.dequantize`` of the same bytes.

    Example::

        w = QuantWeight(torch.from_numpy(raw).view(rows, -1), QuantType.Q4_K, cols=2048)
        y = deepinfer_kernels.quant_linear(x, w)
    """

    data: torch.Tensor
    qtype: QuantType
    cols: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "qtype", quant_type(self.qtype))
        if not isinstance(self.cols, int) or isinstance(self.cols, bool):
            raise TypeError(f"cols: expected an int, got {type(self.cols).__name__}")
        import torch

        expected = row_bytes(self.qtype, self.cols)
        d = self.data
        if not isinstance(d, torch.Tensor) or d.dtype != torch.uint8 or d.dim() != 2:
            raise ValueError("data: expected a 2-d uint8 tensor [rows, row_bytes]")
        if d.shape[1] != expected:
            raise ValueError(
                f"data: a {self.qtype.name} row of {self.cols} weights is {expected} bytes, "
                f"got {d.shape[1]}"
            )
        if not d.is_contiguous():
            raise ValueError("data: expected a contiguous tensor")

    @property
    def rows(self) -> int:
        return int(self.data.shape[0])

    @property
    def shape(self) -> tuple[int, int]:
        return (self.rows, self.cols)

    @property
    def nbytes(self) -> int:
        return int(self.data.numel())

    def select_rows(self, index: torch.Tensor | slice) -> QuantWeight:
        """The rows ``index`` (a slice or an index tensor) as a new weight (copied when not a
        contiguous slice)."""
        return QuantWeight(self.data[index].contiguous(), self.qtype, self.cols)

    def to(self, device: torch.device | str) -> QuantWeight:
        return QuantWeight(self.data.to(device), self.qtype, self.cols)
