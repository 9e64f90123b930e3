"""Every decoder layer's projection weights as GGUF blocks, for ``QuantDecoderLayerKernel``.

The counterpart of :class:`~deepinfer_kernels.cpu.decoder_panels.DecoderPanels` for models
whose projections keep their checkpoint's format (a GGUF file's Q4_1/Q8_0/... rows, a bf16
checkpoint's own bf16 tensors): a projection offers its weight through a ``block_matrix()``
method returning a :class:`~deepinfer_kernels.cpu.quant_decoder_layer.BlockMatrix` over its own
bytes (no copy). A layer whose projections do not all offer one, or whose projections other
than QKV have a bias, is refused, and the model keeps its other paths.
"""

from __future__ import annotations

from typing import Any

from deepinfer_kernels.cpu.decoder_panels import LayerProjections, LayerWeightCache
from deepinfer_kernels.cpu.quant_decoder_layer import BlockMatrix, LayerBlocks


def block_matrix_of(projection: Any) -> BlockMatrix | None:
    """``projection.block_matrix()`` when it has one and it gives a :class:`BlockMatrix`."""
    method = getattr(projection, "block_matrix", None)
    if method is None:
        return None
    matrix = method()
    return matrix if isinstance(matrix, BlockMatrix) else None


class DecoderBlocks(LayerWeightCache[LayerBlocks]):
    """The block-format weights of a model's decoder layers (see the module doc)."""

    def build(self, layer: LayerProjections) -> LayerBlocks | None:
        qkv, *plain = layer
        if any(p.bias is not None for p in plain):
            return None
        matrices = [block_matrix_of(p) for p in layer]
        if any(m is None for m in matrices):
            return None
        q, o, gu, d = (m for m in matrices if m is not None)
        bias = qkv.bias
        return LayerBlocks(q, None if bias is None else bias.detach().contiguous(), o, gu, d)
