"""Weights kept in GGUF block formats (Q4_0, Q4_1, Q8_0, Q4_K, Q5_K, Q6_K, F16, BF16, F32) and
the products that dequantise them on the fly: see docs/kernels.md, "Quantised weights".

Example::

    import torch
    from deepinfer_kernels.quant import QuantType, QuantWeight, quant_linear

    raw = torch.zeros(8, 18, dtype=torch.uint8)          # 8 rows of one Q4_0 block each
    y = quant_linear(torch.randn(2, 32), QuantWeight(raw, QuantType.Q4_0, cols=32))
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

from deepinfer_kernels.quant.formats import (
    BLOCK_GEOMETRY,
    QK_K,
    QuantType,
    QuantWeight,
    quant_type,
    row_bytes,
)

if TYPE_CHECKING:
    from deepinfer_kernels.quant.cpu import QuantGemvKernel
    from deepinfer_kernels.quant.ops import (
        GEMV_MAX_ROWS,
        dequantize,
        dequantize_rows,
        quant_linear,
        quant_swiglu,
    )

# PEP 562 lazy re-exports of the torch parts ({name: module}): the formats above import no
# torch, so a torch-free process can read block geometry (``deepinfer_kernels.cpu.numpy_ops``).
_EXPORTS = {
    "QuantGemvKernel": "cpu",
    "GEMV_MAX_ROWS": "ops",
    "dequantize": "ops",
    "dequantize_rows": "ops",
    "quant_linear": "ops",
    "quant_swiglu": "ops",
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f"{__name__}.{module}"), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


__all__ = [
    "BLOCK_GEOMETRY",
    "GEMV_MAX_ROWS",
    "QK_K",
    "QuantGemvKernel",
    "QuantType",
    "QuantWeight",
    "dequantize",
    "dequantize_rows",
    "quant_linear",
    "quant_swiglu",
    "quant_type",
    "row_bytes",
]
