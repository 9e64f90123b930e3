"""Projections and embeddings whose weights stay in their checkpoint's format (GGUF blocks).

:class:`QuantLinear` holds the raw bytes of one or more row blocks (a fused QKV projection
may join a Q4_K query with a Q6_K value, as llama.cpp's mixed quantisations do) and computes
``x W^T`` with :func:`deepinfer_kernels.quant.quant_linear`: the values are exactly the
format's (bit-identical to ``gguf.quants.dequantize``), the arithmetic fp32, and the bytes in
memory are the file's (Q4_1: 5 bits a weight instead of fp32's 32). :class:`QuantEmbedding`
dequantises only the rows it looks up, and serves as the tied LM head through the same
product, so the table is held once, in its file format.

Both are drop-in subclasses of the float modules (``isinstance`` checks and module paths stay
as they are); their ``weight`` parameter is the uint8 bytes, which no float kernel accepts. A
decode step on the CPU runs each decoder layer as two compiled calls over these bytes
(:meth:`QuantLinear.block_matrix`, ``deepinfer_kernels.cpu.QuantDecoderLayerKernel``); other
steps run :meth:`QuantLinear.forward` per projection.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch
from torch import nn

from deepinfer.models.layers import Embedding, Linear
from deepinfer_kernels.cpu import BlockMatrix, PackedWeight
from deepinfer_kernels.cpu.decoder_panels import weight_key
from deepinfer_kernels.quant import (
    QuantType,
    QuantWeight,
    dequantize,
    dequantize_rows,
    quant_linear,
    quant_swiglu,
    row_bytes,
)


class QuantLinear(Linear):
    """``y = x W^T (+ b)`` with ``W`` the row-wise concatenation of ``parts`` (each a
    :class:`QuantWeight` of ``in_features`` columns, any supported type).

    Example::

        lin = QuantLinear([q, k, v])  # QuantWeights from a GGUF file
        y = lin(x)                    # [..., q.rows + k.rows + v.rows]
    """

    def __init__(self, parts: Sequence[QuantWeight], bias: torch.Tensor | None = None) -> None:
        nn.Module.__init__(self)  # not Linear.__init__: no float storage is allocated
        if not parts:
            raise ValueError("parts: expected at least one QuantWeight")
        cols = parts[0].cols
        if any(p.cols != cols for p in parts):
            raise ValueError(f"parts: every part must have {cols} columns")
        device = parts[0].data.device
        self.in_features = cols
        self.out_features = sum(p.rows for p in parts)
        self.layout: tuple[tuple[QuantType, int], ...] = tuple((p.qtype, p.rows) for p in parts)
        if len(parts) == 1:
            flat = parts[0].data.reshape(-1)
        elif device.type == "cpu":
            # numpy: torch.cat / copy_ run OpenMP loops that stalled 25x on a busy 2-core box
            flat = torch.from_numpy(np.concatenate([p.data.reshape(-1).numpy() for p in parts]))
        else:
            flat = torch.cat([p.data.reshape(-1) for p in parts])
        self.weight = nn.Parameter(flat, requires_grad=False)
        if bias is not None and tuple(bias.shape) != (self.out_features,):
            raise ValueError(f"bias: expected [{self.out_features}], got {tuple(bias.shape)}")
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)
        self.packed = PackedWeight()  # unused: kept so code that sets its kernel still works

    def parts(self) -> list[QuantWeight]:
        """The blocks as :class:`QuantWeight` views of :attr:`weight` (no copy)."""
        return self._views(self.layout)

    def runs(self) -> list[QuantWeight]:
        """:meth:`parts` with neighbours of one format joined into one view (no copy): a Q4_1
        QKV is one product of 960 rows, not three products and a concatenation of their
        outputs (a 2048-token prefill: one MKL call of N=960 instead of 576/192/192, and no
        copy of the 2048 x 960 result)."""
        joined: list[tuple[QuantType, int]] = []
        for qtype, rows in self.layout:
            if joined and joined[-1][0] == qtype:
                joined[-1] = (qtype, joined[-1][1] + rows)
            else:
                joined.append((qtype, rows))
        return self._views(joined)

    def _views(self, layout: Sequence[tuple[QuantType, int]]) -> list[QuantWeight]:
        """One :class:`QuantWeight` view of :attr:`weight` per ``(format, rows)`` of ``layout``,
        in order (their rows must add up to the weight's)."""
        out, start = [], 0
        flat = self.weight.detach()
        for qtype, rows in layout:
            size = rows * row_bytes(qtype, self.in_features)
            out.append(
                QuantWeight(flat[start : start + size].view(rows, -1), qtype, self.in_features)
            )
            start += size
        return out

    def forward(self, x: torch.Tensor, contiguous: bool = True) -> torch.Tensor:
        parts = self.runs()
        bias = self.bias
        if len(parts) == 1:
            return quant_linear(x, parts[0], bias)
        ys, start = [], 0
        for part in parts:
            b = None if bias is None else bias[start : start + part.rows]
            ys.append(quant_linear(x, part, b))
            start += part.rows
        return torch.cat(ys, dim=-1)

    def gated_product(self, x: torch.Tensor) -> torch.Tensor | None:
        """``silu(x Wg^T) * (x Wu^T)`` for a gate-and-up projection (the gate's rows, then the
        up's) in one compiled pass, or None where that does not apply (several formats, a
        bias, few rows, no AVX-512: see ``quant_swiglu``); ``LlamaMLP`` asks first."""
        runs = self.runs()
        if len(runs) != 1 or self.bias is not None:
            return None
        return quant_swiglu(x, runs[0])

    def block_matrix(self) -> BlockMatrix | None:
        """The weight as the compiled block-format decoder layer reads it (a view of its bytes,
        no copy), or None off the CPU or for non-contiguous bytes (``DecoderBlocks`` asks)."""
        flat = self.weight.detach()
        if flat.device.type != "cpu" or not flat.is_contiguous():
            return None
        return BlockMatrix(flat, self.layout, self.in_features)

    def head_product(self, x: torch.Tensor) -> torch.Tensor:
        """The product as an LM head (same as :meth:`forward`; ``LlamaModel.compute_logits``
        calls a head's ``head_product`` when it has one)."""
        return self.forward(x)

    def head_rows(self, ids: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
        """``x -> (x W^T)[..., ids]`` from a copy of those rows (their bytes when the head is
        one block, else their fp32 values)."""
        parts = self.parts()
        if len(parts) == 1:
            rows = parts[0].select_rows(ids)
            return lambda x: quant_linear(x, rows)
        w = self.dequantized()[ids]
        return lambda x: x.float() @ w.t()

    def dequantized(self) -> torch.Tensor:
        """The fp32 weight ``[out_features, in_features]`` (a new tensor; for tests and tools)."""
        return torch.cat([dequantize(p) for p in self.parts()])

    def extra_repr(self) -> str:
        kinds = "+".join(f"{q.name}x{r}" for q, r in self.layout)
        return f"in_features={self.in_features}, out_features={self.out_features}, {kinds}"


class QuantEmbedding(Embedding):
    """Token table ``[vocab, dim]`` kept as ``table``'s bytes; a lookup dequantises its rows.

    :meth:`head_product` is the tied LM head ``x E^T`` on the same bytes.
    """

    def __init__(self, table: QuantWeight) -> None:
        nn.Module.__init__(self)
        self.num_embeddings, self.embedding_dim = table.rows, table.cols
        self.qtype = table.qtype
        self.weight = nn.Parameter(table.data, requires_grad=False)
        # The last table() answer and the weight it was made from (the tensor and its
        # weight_key): the LM head asks at every step.
        self._table: tuple[QuantWeight, torch.Tensor, tuple[int, int]] | None = None

    def table(self) -> QuantWeight:
        """:attr:`weight`'s bytes as a :class:`QuantWeight` (a view, no copy), kept while the
        weight is current (the same tensor, storage and version: ``LayerWeightCache``'s
        rule), so that a replaced weight, new ``.data`` or an in-place write is seen."""
        weight = self._parameters["weight"]
        cached = self._table
        if cached is not None and cached[1] is weight and weight_key(weight) == cached[2]:
            return cached[0]
        if weight is None:
            raise ValueError("weight: QuantEmbedding has no weight")
        table = QuantWeight(weight.detach(), self.qtype, self.embedding_dim)
        self._table = (table, weight, weight_key(weight))
        return table

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """fp32 ``[*ids.shape, dim]``: the rows ``ids``, dequantised (only those rows)."""
        return dequantize_rows(self.table(), ids)

    def head_product(self, x: torch.Tensor) -> torch.Tensor:
        """``x E^T``: the tied LM head on the table's bytes."""
        return quant_linear(x, self.table())

    def head_rows(self, ids: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
        """``x -> (x E^T)[..., ids]`` from a copy of those rows' bytes."""
        rows = self.table().select_rows(ids)
        return lambda x: quant_linear(x, rows)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, {self.qtype.name}"
