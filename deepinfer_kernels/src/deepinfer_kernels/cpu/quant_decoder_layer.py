"""A decoder layer as two compiled calls around its attention, weights in GGUF block formats.

:class:`~deepinfer_kernels.cpu.decoder_layer.DecoderLayerKernel` reads bf16 panels; this
kernel (``csrc/quant_decoder_layer.c``) runs the same two halves (QKV product, RoPE, K/V write;
output projection, residual add, norm, SwiGLU MLP, residual add, next input norm) over the
file's own bytes: Q4_0, Q4_1, Q8_0, Q4_K, Q5_K, Q6_K, F16, BF16 or F32 rows, dequantised on
the fly exactly as ``gguf.quants.dequantize`` does and multiplied in fp32
(``quant/csrc/gguf_blocks.h``). A GGUF model's decode step is then two foreign calls per layer
(plus its attention) instead of about twelve torch ops, one ctypes call per product.

Example::

    kernel = QuantDecoderLayerKernel()
    blocks = LayerBlocks(BlockMatrix.of(q, k, v), None, BlockMatrix.of(o),
                         BlockMatrix.of(gate, up), BlockMatrix.of(down))
    kernel.qkv(x, blocks, shape, cos, sin, slots, k_cache, v_cache, out)
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from deepinfer_kernels.cpu.decoder_layer import FusedLayerKernel, LayerShape, SlotMapping
from deepinfer_kernels.cpu.numpy_blocks import segment_table
from deepinfer_kernels.cpu.sources import QUANT_DECODER_LAYER
from deepinfer_kernels.quant.formats import (
    BLOCK_GEOMETRY,
    QuantType,
    QuantWeight,
    quant_type,
    row_bytes,
)

SOURCE = QUANT_DECODER_LAYER.path


@dataclass(frozen=True)
class BlockMatrix:
    """A weight ``[rows, cols]`` as raw GGUF rows: ``data`` (contiguous uint8 CPU bytes, any
    shape) holds ``layout``'s segments one after the other, each ``(qtype, rows)`` rows of
    ``cols`` weights in that format. ``segments`` is the C kernel's table (int64 ``[1 + 3 n]``:
    ``n``, then ``(qtype, rows, row_bytes)`` per segment, adjacent equal types merged)."""

    data: torch.Tensor
    layout: tuple[tuple[QuantType, int], ...]
    cols: int
    segments: torch.Tensor = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        table, want = segment_table(self.layout, self.cols)
        d = self.data
        if d.dtype != torch.uint8 or d.device.type != "cpu" or not d.is_contiguous():
            raise ValueError(f"data: expected contiguous uint8 CPU bytes, got {d.dtype} on "
                             f"{d.device}")  # fmt: skip
        if d.numel() != want:
            raise ValueError(f"data: the layout holds {want} bytes, got {d.numel()}")
        object.__setattr__(self, "segments", torch.tensor(table, dtype=torch.int64))

    @classmethod
    def of(cls, *parts: QuantWeight) -> BlockMatrix:
        """The row-wise concatenation of ``parts`` (one copy when there are several)."""
        if not parts:
            raise ValueError("parts: expected at least one QuantWeight")
        cols = parts[0].cols
        if any(p.cols != cols for p in parts):
            raise ValueError(f"parts: every part must have {cols} columns")
        flat = [p.data.reshape(-1) for p in parts]
        data = flat[0] if len(flat) == 1 else torch.cat(flat)
        return cls(data, tuple((p.qtype, p.rows) for p in parts), cols)

    @classmethod
    def from_segments(cls, data: torch.Tensor, segments: torch.Tensor) -> BlockMatrix:
        """The matrix a C segment table (:attr:`segments`) describes over ``data`` (the form
        the ``torch.library`` ops take), checked as the constructor checks."""
        table = [int(v) for v in segments.reshape(-1).tolist()]
        if not table or table[0] < 1 or len(table) != 1 + 3 * table[0]:
            raise ValueError("segments: expected [n, (qtype, rows, row_bytes) x n] with n >= 1")
        layout, cols = [], None
        for i in range(table[0]):
            qtype, rows, size = table[1 + 3 * i : 4 + 3 * i]
            q = quant_type(qtype, "segments")
            block, block_bytes = BLOCK_GEOMETRY[q]
            if size <= 0 or size % block_bytes:
                raise ValueError(f"segments: {q.name} rows of {size} bytes")
            width = size // block_bytes * block
            if cols is not None and width != cols:
                raise ValueError(f"segments: rows of {width} and {cols} weights in one matrix")
            cols = width
            layout.append((q, rows))
        assert cols is not None
        return cls(data.reshape(-1), tuple(layout), cols)

    @property
    def rows(self) -> int:
        return sum(rows for _, rows in self.layout)

    def dequantized(self) -> torch.Tensor:
        """The fp32 matrix ``[rows, cols]`` (a new tensor: for fallbacks, tests and tools)."""
        from deepinfer_kernels.quant.ops import dequantize

        return torch.cat([dequantize(p) for p in self.parts()])

    def parts(self) -> list[QuantWeight]:
        """The segments as :class:`QuantWeight` views of :attr:`data`."""
        out, start, flat = [], 0, self.data.reshape(-1)
        for qtype, rows in self.layout:
            size = rows * row_bytes(qtype, self.cols)
            out.append(QuantWeight(flat[start : start + size].view(rows, -1), qtype, self.cols))
            start += size
        return out


@dataclass(frozen=True)
class LayerBlocks:
    """One decoder layer's projection weights as :class:`BlockMatrix` (QKV and gate/up fused
    row-wise, as :class:`~deepinfer_kernels.cpu.decoder_layer.LayerPanels`)."""

    qkv: BlockMatrix
    qkv_bias: torch.Tensor | None
    o: BlockMatrix
    gate_up: BlockMatrix
    down: BlockMatrix


def check_blocks(shape: LayerShape, blocks: LayerBlocks, part: str = "both") -> None:
    """Raise ``ValueError`` naming the first matrix of ``blocks`` that does not fit ``shape``
    (``part``: ``"qkv"`` checks the QKV matrix and bias only, ``"mlp"`` the others)."""
    h, q = shape.hidden, shape.num_heads * shape.head_dim
    want = {
        "qkv": (shape.qkv_width, h),
        "o": (h, q),
        "gate_up": (2 * shape.intermediate, h),
        "down": (h, shape.intermediate),
    }
    if part == "qkv":
        want = {"qkv": want["qkv"]}
    elif part == "mlp":
        del want["qkv"]
    for name, dims in want.items():
        m = getattr(blocks, name)
        if not isinstance(m, BlockMatrix) or (m.rows, m.cols) != dims:
            got = (m.rows, m.cols) if isinstance(m, BlockMatrix) else type(m).__name__
            raise ValueError(f"blocks.{name}: expected a BlockMatrix {dims}, got {got}")
    bias = blocks.qkv_bias
    if (
        part != "mlp"
        and bias is not None
        and (
            tuple(bias.shape) != (shape.qkv_width,)
            or bias.dtype != torch.float32
            or not bias.is_contiguous()
        )
    ):
        raise ValueError(f"blocks.qkv_bias: expected contiguous fp32 [{shape.qkv_width}]")


class QuantDecoderLayerKernel(FusedLayerKernel[LayerBlocks]):
    """The two compiled halves of a layer over :class:`LayerBlocks` (``enabled=None`` reads
    ``DEEPINFER_CPU_KERNELS``); the interface is :class:`FusedLayerKernel`'s (``qkv``,
    ``mlp``, ``bind``, ``applies``, ``slot_mapping``)."""

    source = QUANT_DECODER_LAYER
    qkv_symbol = "deepinfer_qdecoder_qkv"
    mlp_symbol = "deepinfer_qdecoder_mlp"

    def check_weights(self, shape: LayerShape, weights: LayerBlocks, part: str = "both") -> None:
        check_blocks(shape, weights, part)

    def qkv_args(
        self,
        x: torch.Tensor,
        weights: LayerBlocks,
        shape: LayerShape,
        cos: torch.Tensor,
        sin: torch.Tensor,
        slots: SlotMapping,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        out: torch.Tensor,
    ) -> tuple[object, ...]:
        bias = weights.qkv_bias
        return (
            x.data_ptr(), weights.qkv.data.data_ptr(), weights.qkv.segments.data_ptr(),
            None if bias is None else bias.data_ptr(), out.data_ptr(), cos.data_ptr(),
            sin.data_ptr(), slots.slots.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(),
            x.shape[0], shape.hidden, shape.num_heads, shape.num_kv_heads, shape.head_dim,
        )  # fmt: skip

    def mlp_args(
        self,
        attn: torch.Tensor,
        weights: LayerBlocks,
        shape: LayerShape,
        residual: torch.Tensor,
        normed: torch.Tensor,
        post_norm: torch.Tensor,
        next_norm: torch.Tensor,
        eps: float,
        scratch: torch.Tensor,
    ) -> tuple[object, ...]:
        o, gu, down = weights.o, weights.gate_up, weights.down
        return (
            attn.data_ptr(), o.data.data_ptr(), o.segments.data_ptr(), residual.data_ptr(),
            normed.data_ptr(), post_norm.data_ptr(), gu.data.data_ptr(),
            gu.segments.data_ptr(), down.data.data_ptr(), down.segments.data_ptr(),
            next_norm.data_ptr(), eps, scratch.data_ptr(), attn.shape[0], shape.hidden,
            shape.num_heads * shape.head_dim, shape.intermediate,
        )  # fmt: skip
