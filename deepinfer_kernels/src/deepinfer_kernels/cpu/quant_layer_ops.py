"""``torch.library`` registrations of the block-format decoder layer halves, each with a fake.

============================================  =================================================
op                                            what
============================================  =================================================
``deepinfer::quant_decoder_layer_qkv``        QKV product over GGUF rows, RoPE, K/V write
                                              (mutates the caches)
``deepinfer::quant_decoder_layer_mlp``        o-proj, add, norm, SwiGLU, add, next norm over
                                              GGUF rows (mutates ``residual``)
============================================  =================================================

A weight is passed as its bytes (uint8) and its C segment table (int64
``[n, (qtype, rows, row_bytes) x n]``, :attr:`BlockMatrix.segments`). As in
:mod:`deepinfer_kernels.cpu.ops`, eager callers use the kernel handle directly; the ops run the
process's default kernel where the operands fit and torch over the dequantised weights
otherwise, and equal their references (``quant_decoder_*_reference``) to fp32 rounding.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from deepinfer_kernels.cpu.decoder_layer import LayerShape
from deepinfer_kernels.cpu.ops import default_kernels, dense_mlp_half, rope_and_write_kv
from deepinfer_kernels.cpu.quant_decoder_layer import BlockMatrix, LayerBlocks


def _qkv_width(x: torch.Tensor, cos: torch.Tensor, num_heads: int, num_kv_heads: int) -> int:
    return (num_heads + 2 * num_kv_heads) * cos.shape[-1]


@torch.library.custom_op("deepinfer::quant_decoder_layer_qkv", mutates_args=("k_cache", "v_cache"))
def quant_decoder_layer_qkv_op(
    x: torch.Tensor,
    qkv_data: torch.Tensor,
    qkv_segments: torch.Tensor,
    qkv_bias: torch.Tensor | None,
    cos: torch.Tensor,
    sin: torch.Tensor,
    slots: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    num_heads: int,
    num_kv_heads: int,
) -> torch.Tensor:
    rows, d = x.shape[0], cos.shape[-1]
    width = _qkv_width(x, cos, num_heads, num_kv_heads)
    qkv_w = BlockMatrix.from_segments(qkv_data, qkv_segments)
    kernel = default_kernels().quant_layer
    if kernel is not None and kernel.available() and rows:
        shape = LayerShape(x.shape[1], num_heads, num_kv_heads, d, 0)
        out = x.new_empty(rows, width)
        slot_map = kernel.slot_mapping(slots, k_cache.shape[0] * k_cache.shape[1])
        blocks = LayerBlocks(qkv_w, qkv_bias, qkv_w, qkv_w, qkv_w)
        kernel.qkv(x, blocks, shape, cos, sin, slot_map, k_cache, v_cache, out)
        return out
    qkv = F.linear(x, qkv_w.dequantized(), qkv_bias)
    return rope_and_write_kv(qkv, cos, sin, slots, k_cache, v_cache, num_heads, num_kv_heads)


@quant_decoder_layer_qkv_op.register_fake
def _(
    x: torch.Tensor,
    qkv_data: torch.Tensor,
    qkv_segments: torch.Tensor,
    qkv_bias: torch.Tensor | None,
    cos: torch.Tensor,
    sin: torch.Tensor,
    slots: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    num_heads: int,
    num_kv_heads: int,
) -> torch.Tensor:
    return x.new_empty(x.shape[0], _qkv_width(x, cos, num_heads, num_kv_heads))


@torch.library.custom_op("deepinfer::quant_decoder_layer_mlp", mutates_args=("residual",))
def quant_decoder_layer_mlp_op(
    attn: torch.Tensor,
    o_data: torch.Tensor,
    o_segments: torch.Tensor,
    residual: torch.Tensor,
    post_norm: torch.Tensor,
    gate_up_data: torch.Tensor,
    gate_up_segments: torch.Tensor,
    down_data: torch.Tensor,
    down_segments: torch.Tensor,
    next_norm: torch.Tensor,
    eps: float,
) -> torch.Tensor:
    rows, hidden = residual.shape
    o = BlockMatrix.from_segments(o_data, o_segments)
    gate_up = BlockMatrix.from_segments(gate_up_data, gate_up_segments)
    down = BlockMatrix.from_segments(down_data, down_segments)
    inter = down.cols
    kernel = default_kernels().quant_layer
    if kernel is not None and kernel.available() and rows:
        shape = LayerShape(hidden, 1, 1, attn.shape[1], inter)
        blocks = LayerBlocks(o, None, o, gate_up, down)
        normed = torch.empty_like(residual)
        scratch = residual.new_empty(shape.scratch_size(rows))
        kernel.mlp(attn, blocks, shape, residual, normed, post_norm, next_norm, eps, scratch)
        return normed
    return dense_mlp_half(
        attn,
        o.dequantized(),
        residual,
        post_norm,
        gate_up.dequantized(),
        down.dequantized(),
        next_norm,
        eps,
    )


@quant_decoder_layer_mlp_op.register_fake
def _(
    attn: torch.Tensor,
    o_data: torch.Tensor,
    o_segments: torch.Tensor,
    residual: torch.Tensor,
    post_norm: torch.Tensor,
    gate_up_data: torch.Tensor,
    gate_up_segments: torch.Tensor,
    down_data: torch.Tensor,
    down_segments: torch.Tensor,
    next_norm: torch.Tensor,
    eps: float,
) -> torch.Tensor:
    return torch.empty_like(residual)
