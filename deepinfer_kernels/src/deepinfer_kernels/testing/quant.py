"""Hypothesis strategies and helpers for kernels over GGUF block-format weights.

``quant_blocks(qtype, rows, cols)`` draws raw rows the way a quantiser writes them: every
quantised byte random, the fp16 scales (``d``, ``m``/``dmin``) finite and of a realistic size,
so products stay finite and no subnormal scale slows a benchmark. ``raw_blocks`` leaves every
byte random (NaN, infinity and subnormal scales included) for bit-identity tests.

Example::

    from hypothesis import given
    from deepinfer_kernels.testing.quant import quant_weights

    @given(quant_weights())
    def test_my_kernel(w):
        ...
"""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import strategies as st

from deepinfer_kernels.quant.formats import BLOCK_GEOMETRY, QuantType, QuantWeight

# Byte offsets of the fp16 scale fields inside one block, per type.
SCALE_OFFSETS: dict[QuantType, tuple[int, ...]] = {
    QuantType.Q4_0: (0,),
    QuantType.Q4_1: (0, 2),
    QuantType.Q8_0: (0,),
    QuantType.Q4_K: (0, 2),
    QuantType.Q5_K: (0, 2),
    QuantType.Q6_K: (208,),
}
BLOCK_TYPES = tuple(SCALE_OFFSETS)
FLOAT_TYPES = (QuantType.F32, QuantType.F16, QuantType.BF16)


def random_quant_rows(
    qtype: QuantType, rows: int, cols: int, seed: int, scale: float = 0.02
) -> torch.Tensor:
    """uint8 ``[rows, row_bytes]``: random quantised bytes with finite fp16 scales of about
    ``scale`` (float types: normal values times ``scale`` in that dtype)."""
    rng = np.random.default_rng(seed)
    block, size = BLOCK_GEOMETRY[qtype]
    if qtype in FLOAT_TYPES:
        values = torch.from_numpy(rng.standard_normal((rows, cols), dtype=np.float32) * scale)
        dtype = {QuantType.F32: torch.float32, QuantType.F16: torch.float16}.get(
            qtype, torch.bfloat16
        )
        return values.to(dtype).view(torch.uint8).contiguous()
    raw = rng.integers(0, 256, size=(rows, cols // block, size), dtype=np.uint8)
    for offset in SCALE_OFFSETS[qtype]:
        d = (np.abs(rng.standard_normal((rows, cols // block))) * scale + scale / 8).astype(
            np.float16
        )
        raw[:, :, offset : offset + 2] = d.view(np.uint8).reshape(rows, cols // block, 2)
    return torch.from_numpy(raw.reshape(rows, -1))


@st.composite
def quant_weights(
    draw: st.DrawFn,
    qtypes: tuple[QuantType, ...] = BLOCK_TYPES + FLOAT_TYPES,
    max_rows: int = 24,
    max_blocks: int = 3,
) -> QuantWeight:
    """A :class:`QuantWeight` of a drawn type and shape with realistic scales."""
    qtype = draw(st.sampled_from(qtypes))
    block = BLOCK_GEOMETRY[qtype][0]
    # Float types: widths that are not multiples of 16 exercise the kernels' tails.
    unit = 32 if block == 1 else block
    cols = draw(st.integers(1, max_blocks)) * unit + (draw(st.integers(0, 7)) if block == 1 else 0)
    rows = draw(st.integers(1, max_rows))
    seed = draw(st.integers(0, 2**32 - 1))
    return QuantWeight(random_quant_rows(qtype, rows, cols, seed), qtype, cols)


@st.composite
def raw_blocks(draw: st.DrawFn, qtypes: tuple[QuantType, ...] = BLOCK_TYPES) -> QuantWeight:
    """A :class:`QuantWeight` whose every byte is random (non-finite scales included)."""
    qtype = draw(st.sampled_from(qtypes))
    block, size = BLOCK_GEOMETRY[qtype]
    rows, nblocks = draw(st.integers(1, 6)), draw(st.integers(1, 3))
    seed = draw(st.integers(0, 2**32 - 1))
    raw = np.random.default_rng(seed).integers(0, 256, size=(rows, nblocks * size), dtype=np.uint8)
    return QuantWeight(torch.from_numpy(raw), qtype, nblocks * block)


def product_tolerance(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Per-element bound on fp32 rounding of ``x @ w.T`` summed in any order:
    ``K * eps * (|x| @ |w|.T)`` plus a tiny absolute floor."""
    k = x.shape[-1]
    return k * 1.2e-7 * (x.abs().double() @ w.abs().double().t()).float() + 1e-30


def swiglu_tolerance(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Per-element bound (float64) on fp32 rounding of ``silu(x Wg^T) * (x Wu^T)`` for ``w``
    the fp32 gate rows then up rows: the products' bound carried through silu
    (``|silu'| <= 1.1``) and the product with the other half, plus a few ulp of the result
    for the exponential, the division and the multiplication."""
    gate, up = (x.double() @ w.double().t()).chunk(2, dim=-1)
    tol_g, tol_u = product_tolerance(x, w).double().chunk(2, dim=-1)
    silu = torch.nn.functional.silu(gate)
    return 1.1 * tol_g * up.abs() + tol_u * silu.abs() + 8 * 1.2e-7 * (silu * up).abs() + 1e-6
