"""Weights kept in GGUF block formats (Q4_0, Q4_1, Q8_0, Q4_K, Q5_K, Q6_K, F16, BF16, F32) and
the products that dequantise them on the fly: see docs/kernels.md, "Quantised weights".

Example::

    import torch
    from deepinfer_kernels.quant import QuantType, QuantWeight, quant_linear

    raw = torch.zeros(8, 18, dtype=torch.uint8)          # 8 rows of one Q4_0 block each
    y = quant_linear(torch.randn(2, 32), QuantWeight(raw, QuantType.Q4_0, cols=32))
"""

from deepinfer_kernels.quant.cpu import QuantGemvKernel
from deepinfer_kernels.quant.formats import (
    BLOCK_GEOMETRY,
    QK_K,
    QuantType,
    QuantWeight,
    quant_type,
    row_bytes,
)
from deepinfer_kernels.quant.ops import GEMV_MAX_ROWS, dequantize, quant_linear

__all__ = [
    "BLOCK_GEOMETRY",
    "GEMV_MAX_ROWS",
    "QK_K",
    "QuantGemvKernel",
    "QuantType",
    "QuantWeight",
    "dequantize",
    "quant_linear",
    "quant_type",
    "row_bytes",
]
