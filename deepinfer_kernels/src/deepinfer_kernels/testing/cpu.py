"""Hypothesis strategies for the compiled CPU ops (:mod:`deepinfer_kernels.cpu`).

Weights are drawn bf16-exact (the values the kernels' bf16 panels hold without loss); sizes
cover the kernels' vector widths and their remainders (1, 15, 16, 17, 33 ... lanes), GQA head
ratios, optional biases, 1 to 32 rows and caches whose slots are a shuffled subset::

    from hypothesis import given
    from deepinfer_kernels.testing.cpu import DecoderLayerCase, decoder_layer_cases

    @given(decoder_layer_cases())
    def test_my_layer(case: DecoderLayerCase) -> None: ...
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from hypothesis import strategies as st

# (atol, rtol) of an fp32 op against its fp64 reference: the kernels sum in another order.
CPU_OP_TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float32: (2e-5, 2e-5),
    torch.float16: (2e-3, 2e-3),
    torch.bfloat16: (2e-2, 2e-2),
}


def bf16_exact(*shape: int, gen: torch.Generator, scale: float = 1.0) -> torch.Tensor:
    """An fp32 tensor of bf16 values (low 16 bits zero)."""
    return (torch.randn(*shape, generator=gen) * scale).bfloat16().float()


@dataclass(frozen=True)
class DecoderLayerCase:
    """One decoder layer's weights and one step's operands (fp32, CPU)."""

    rows: int
    hidden: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate: int
    block_size: int
    num_blocks: int
    x: torch.Tensor
    qkv_weight: torch.Tensor
    qkv_bias: torch.Tensor | None
    o_weight: torch.Tensor
    gate_up_weight: torch.Tensor
    down_weight: torch.Tensor
    post_norm: torch.Tensor
    next_norm: torch.Tensor
    cos: torch.Tensor
    sin: torch.Tensor
    slots: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    attn: torch.Tensor
    eps: float


@st.composite
def decoder_layer_cases(draw: st.DrawFn, max_rows: int = 32) -> DecoderLayerCase:
    rows = draw(st.integers(1, max_rows))
    num_kv_heads = draw(st.integers(1, 3))
    num_heads = num_kv_heads * draw(st.sampled_from([1, 2, 3]))
    head_dim = draw(st.sampled_from([2, 8, 16, 18, 32]))
    hidden = draw(st.sampled_from([8, 15, 16, 17, 33, 64]))
    intermediate = draw(st.sampled_from([1, 16, 17, 40]))
    block_size = draw(st.sampled_from([1, 4, 16]))
    with_bias = draw(st.booleans())
    eps = draw(st.sampled_from([1e-6, 1e-5]))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    capacity = rows + draw(st.integers(0, 2 * block_size))
    num_blocks = -(-capacity // block_size)
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:rows]
    width = (num_heads + 2 * num_kv_heads) * head_dim
    angles = torch.rand(rows, head_dim // 2, generator=gen) * 6.3
    cos = torch.cat([angles.cos(), angles.cos()], dim=-1)
    sin = torch.cat([-angles.sin(), angles.sin()], dim=-1)
    cache_shape = (num_blocks, block_size, num_kv_heads, head_dim)
    return DecoderLayerCase(
        rows=rows,
        hidden=hidden,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        intermediate=intermediate,
        block_size=block_size,
        num_blocks=num_blocks,
        x=torch.randn(rows, hidden, generator=gen),
        qkv_weight=bf16_exact(width, hidden, gen=gen, scale=0.3),
        qkv_bias=torch.randn(width, generator=gen) if with_bias else None,
        o_weight=bf16_exact(hidden, num_heads * head_dim, gen=gen, scale=0.3),
        gate_up_weight=bf16_exact(2 * intermediate, hidden, gen=gen, scale=0.3),
        down_weight=bf16_exact(hidden, intermediate, gen=gen, scale=0.3),
        post_norm=torch.rand(hidden, generator=gen) + 0.5,
        next_norm=torch.rand(hidden, generator=gen) + 0.5,
        cos=cos,
        sin=sin,
        slots=slots,
        k_cache=torch.randn(cache_shape, generator=gen),
        v_cache=torch.randn(cache_shape, generator=gen),
        attn=torch.randn(rows, num_heads * head_dim, generator=gen),
        eps=eps,
    )
