"""Every decoder layer's projection weights as GGUF blocks, for ``QuantDecoderLayerKernel``.

The counterpart of :class:`~deepinfer_kernels.cpu.decoder_panels.DecoderPanels` for models
whose projections keep their checkpoint's format (a GGUF file's Q4_1/Q8_0/... rows, a bf16
checkpoint's own bf16 tensors): a projection offers its weight through a ``block_matrix()``
method returning a :class:`~deepinfer_kernels.cpu.quant_decoder_layer.BlockMatrix` over its own
bytes (no copy); a float projection next to them joins as F32/BF16/F16 rows over its own
weight. A layer with no block-format projection, or whose projections other than QKV have a
bias, is refused, and the model keeps its other paths.
"""

from __future__ import annotations

from typing import Any

import torch

from deepinfer_kernels.cpu.decoder_panels import LayerProjections, LayerWeightCache
from deepinfer_kernels.cpu.quant_decoder_layer import BlockMatrix, LayerBlocks
from deepinfer_kernels.quant.formats import QuantType

# Float weights a layer's block-format projections can sit next to, as their GGUF type.
_FLOAT_TYPES = {torch.float32: QuantType.F32, torch.bfloat16: QuantType.BF16,
                torch.float16: QuantType.F16}  # fmt: skip


def native_block_matrix(projection: Any) -> BlockMatrix | None:
    """``projection.block_matrix()`` when it has one and it gives a :class:`BlockMatrix`."""
    method = getattr(projection, "block_matrix", None)
    if method is None:
        return None
    matrix = method()
    return matrix if isinstance(matrix, BlockMatrix) else None


def block_matrix_of(projection: Any) -> BlockMatrix | None:
    """:func:`native_block_matrix`, else a float projection's contiguous 2-d CPU
    fp32/bf16/fp16 weight as one F32/BF16/F16 segment over its own bytes (no copy), else None.
    """
    matrix = native_block_matrix(projection)
    if matrix is not None:
        return matrix
    w = getattr(projection, "weight", None)
    if (
        not isinstance(w, torch.Tensor)
        or w.dim() != 2
        or w.dtype not in _FLOAT_TYPES
        or w.device.type != "cpu"
        or not w.is_contiguous()
        or w.shape[1] == 0
    ):
        return None
    data = w.detach().view(torch.uint8).reshape(-1)
    return BlockMatrix(data, ((_FLOAT_TYPES[w.dtype], int(w.shape[0])),), int(w.shape[1]))


class DecoderBlocks(LayerWeightCache[LayerBlocks]):
    """The block-format weights of a model's decoder layers (see the module doc). A layer is
    taken when some projection keeps a block format (a float model is left to the bf16-panel
    layer and MKL); its float projections join as F32/BF16/F16 segments."""

    def build(self, layer: LayerProjections) -> LayerBlocks | None:
        qkv, *plain = layer
        if any(p.bias is not None for p in plain):
            return None
        if all(native_block_matrix(p) is None for p in layer):
            return None
        matrices = [block_matrix_of(p) for p in layer]
        if any(m is None for m in matrices):
            return None
        q, o, gu, d = (m for m in matrices if m is not None)
        bias = qkv.bias
        return LayerBlocks(q, None if bias is None else bias.detach().contiguous(), o, gu, d)
