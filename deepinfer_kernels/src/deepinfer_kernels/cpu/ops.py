"""``torch.library`` registrations of the compiled CPU ops, each with a fake.

Eager callers (the model runner) call the kernel handles of a :class:`CpuKernels` directly:
a dispatcher round trip per call would cost more than some of these kernels. The ops exist for
``torch.compile`` (the fakes give the compiler shapes), the profiler and other engines that
want them as ops; their bodies run the process's default kernels (:func:`default_kernels`, built
on first use) where the operands fit and plain torch ops otherwise, so they answer on any
machine. Every op equals its reference (:mod:`deepinfer_kernels.reference.cpu`) to fp32
rounding.

====================================  =========================================================
op                                    what
====================================  =========================================================
``deepinfer::add_rms_norm``           ``(r, rms_norm(r) * w)``, ``r = residual + delta``
``deepinfer::bf16_weight_linear``     ``x W^T + b`` with ``W`` held as bf16 panels
``deepinfer::decoder_layer_qkv``      QKV product, RoPE, K/V write (mutates the caches)
``deepinfer::decoder_layer_mlp``      o-proj, add, norm, SwiGLU, add, next norm (mutates
                                      ``residual``)
====================================  =========================================================
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from deepinfer_kernels.cpu.add_rms_norm import rms_norm
from deepinfer_kernels.cpu.bf16_weight_linear import unpack_panels
from deepinfer_kernels.cpu.decoder_layer import LayerPanels, LayerShape
from deepinfer_kernels.cpu.kernels import CpuKernels


@functools.cache
def default_kernels() -> CpuKernels:
    """The kernels the registered ops run on (``CpuKernels.all()``, one per process)."""
    return CpuKernels.all()


# ---------------------------------------------------------------- add_rms_norm
@torch.library.custom_op("deepinfer::add_rms_norm", mutates_args=())
def add_rms_norm_op(
    residual: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    kernel = default_kernels().norm
    if kernel is not None and kernel.applies(residual, delta, weight) and kernel.available():
        summed, normed = kernel(residual, delta, weight, eps)
    else:
        summed = residual if delta is None else residual + delta
        normed = rms_norm(summed, weight, eps)
    # An op's outputs may not alias its inputs.
    return (summed.clone() if summed is residual else summed), normed


@add_rms_norm_op.register_fake
def _(
    residual: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.empty_like(residual), torch.empty_like(residual)


# ---------------------------------------------------------------- bf16_weight_linear
@torch.library.custom_op("deepinfer::bf16_weight_linear", mutates_args=())
def bf16_weight_linear_op(
    x: torch.Tensor, panels: torch.Tensor, out_features: int, bias: torch.Tensor | None
) -> torch.Tensor:
    kernel = default_kernels().linear
    if (
        kernel is not None
        and x.dim() == 2
        and x.dtype == torch.float32
        and x.device.type == "cpu"
        and kernel.available()
    ):
        return kernel(x, panels, out_features, bias)
    return F.linear(x, unpack_panels(panels, out_features).to(x.dtype), bias)


@bf16_weight_linear_op.register_fake
def _(
    x: torch.Tensor, panels: torch.Tensor, out_features: int, bias: torch.Tensor | None
) -> torch.Tensor:
    return x.new_empty(x.shape[0], out_features)


# ---------------------------------------------------------------- decoder layer halves
@torch.library.custom_op("deepinfer::decoder_layer_qkv", mutates_args=("k_cache", "v_cache"))
def decoder_layer_qkv_op(
    x: torch.Tensor,
    qkv_panels: torch.Tensor,
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
    width = (num_heads + 2 * num_kv_heads) * d
    kernel = default_kernels().layer
    if kernel is not None and kernel.available() and rows:
        shape = LayerShape(x.shape[1], num_heads, num_kv_heads, d, 0)
        out = x.new_empty(rows, width)
        slot_map = kernel.slot_mapping(slots, k_cache.shape[0] * k_cache.shape[1])
        empty = qkv_panels.new_empty(0)
        panels = LayerPanels(qkv_panels, qkv_bias, empty, empty, empty)
        kernel.qkv(x, panels, shape, cos, sin, slot_map, k_cache, v_cache, out)
        return out
    qkv = F.linear(x, unpack_panels(qkv_panels, width), qkv_bias)
    return rope_and_write_kv(qkv, cos, sin, slots, k_cache, v_cache, num_heads, num_kv_heads)


@decoder_layer_qkv_op.register_fake
def _(
    x: torch.Tensor,
    qkv_panels: torch.Tensor,
    qkv_bias: torch.Tensor | None,
    cos: torch.Tensor,
    sin: torch.Tensor,
    slots: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    num_heads: int,
    num_kv_heads: int,
) -> torch.Tensor:
    return x.new_empty(x.shape[0], (num_heads + 2 * num_kv_heads) * cos.shape[-1])


@torch.library.custom_op("deepinfer::decoder_layer_mlp", mutates_args=("residual",))
def decoder_layer_mlp_op(
    attn: torch.Tensor,
    o_panels: torch.Tensor,
    residual: torch.Tensor,
    post_norm: torch.Tensor,
    gate_up_panels: torch.Tensor,
    down_panels: torch.Tensor,
    next_norm: torch.Tensor,
    eps: float,
) -> torch.Tensor:
    rows, hidden = residual.shape
    inter = down_panels.shape[1]
    kernel = default_kernels().layer
    if kernel is not None and kernel.available() and rows:
        shape = LayerShape(hidden, 1, 1, attn.shape[1], inter)
        panels = LayerPanels(o_panels.new_empty(0), None, o_panels, gate_up_panels, down_panels)
        normed = torch.empty_like(residual)
        scratch = residual.new_empty(shape.scratch_size(rows))
        kernel.mlp(attn, panels, shape, residual, normed, post_norm, next_norm, eps, scratch)
        return normed
    o_w = unpack_panels(o_panels, hidden)
    gate_up_w = unpack_panels(gate_up_panels, 2 * inter)
    down_w = unpack_panels(down_panels, hidden)
    return dense_mlp_half(attn, o_w, residual, post_norm, gate_up_w, down_w, next_norm, eps)


@decoder_layer_mlp_op.register_fake
def _(
    attn: torch.Tensor,
    o_panels: torch.Tensor,
    residual: torch.Tensor,
    post_norm: torch.Tensor,
    gate_up_panels: torch.Tensor,
    down_panels: torch.Tensor,
    next_norm: torch.Tensor,
    eps: float,
) -> torch.Tensor:
    return torch.empty_like(residual)


def rope_and_write_kv(
    qkv: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    slots: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    num_heads: int,
    num_kv_heads: int,
) -> torch.Tensor:
    """The QKV half's torch path after its product (shared by the panel and block-format ops):
    rotate q and k (RoPE, halves swapped), write k and v at ``slots``; the rotated rows."""
    rows, d = qkv.shape[0], cos.shape[-1]
    width = (num_heads + 2 * num_kv_heads) * d
    heads = qkv.view(rows, num_heads + 2 * num_kv_heads, d)
    qk = heads[:, : num_heads + num_kv_heads]
    half = d // 2
    swapped = torch.cat([qk[..., half:], qk[..., :half]], dim=-1)
    rotated = qk * cos[:, None] + swapped * sin[:, None]
    heads = torch.cat([rotated, heads[:, num_heads + num_kv_heads :]], dim=1)
    index = slots.long()
    k_cache.view(-1, num_kv_heads, d).index_copy_(0, index, heads[:, num_heads:-num_kv_heads])
    v_cache.view(-1, num_kv_heads, d).index_copy_(0, index, heads[:, -num_kv_heads:])
    return heads.reshape(rows, width)


def dense_mlp_half(
    attn: torch.Tensor,
    o_w: torch.Tensor,
    residual: torch.Tensor,
    post_norm: torch.Tensor,
    gate_up_w: torch.Tensor,
    down_w: torch.Tensor,
    next_norm: torch.Tensor,
    eps: float,
) -> torch.Tensor:
    """The MLP half's torch path over dense weights (shared by the panel and block-format ops):
    o-proj + residual, norm, SwiGLU, + residual (written into ``residual``), next norm."""
    r = residual + F.linear(attn, o_w)
    n = rms_norm(r, post_norm, eps)
    gate, up = F.linear(n, gate_up_w).chunk(2, dim=-1)
    residual.copy_(r + F.linear(F.silu(gate) * up, down_w))
    return rms_norm(residual, next_norm, eps)
