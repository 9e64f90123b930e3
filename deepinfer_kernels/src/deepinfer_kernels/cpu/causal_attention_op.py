"""``deepinfer::causal_prefill_attention``: one sequence's long causal prefill attention as an op.

For the ``T`` query rows of ``qkv`` (``[T, >= Hq * D]``, Q in its first ``Hq * D`` columns) at
positions ``start .. start + T - 1``, whose keys and values sit in cache slots
``0 .. start + T - 1`` in position order (``k_cache``/``v_cache`` ``[blocks, block_size, Hkv, D]``,
slot ``s`` at ``[s // block_size, s % block_size]``), with ``g = Hq / Hkv``::

    out[t, h] = sum_{j <= start + t} softmax_j(scale * q[t, h] . k[j, h // g]) * v[j, h // g]

The kernel (``causal_prefill_attention.c``, called by
:meth:`~deepinfer_kernels.cpu.numpy_ops.NumpyKernels.causal_attention`, which the lean runtime
uses for prefill chunks past 16 rows) runs it as two GEMMs per query head and 64-row block on
numpy's one-thread OpenBLAS ``cblas_sgemm`` with the softmax between them. The op runs that
kernel where the engine's BLAS rule picks OpenBLAS (:mod:`~deepinfer_kernels.quant.blas_choice`)
and the operands fit (fp32, contiguous, CPU), and the reference
(:func:`~deepinfer_kernels.reference.cpu.causal_prefill_attention_reference`) elsewhere, so it
answers on any machine; the two agree to fp32 rounding.

Example::

    import torch
    from deepinfer_kernels.cpu.causal_attention_op import causal_prefill_attention

    qkv = torch.randn(5, 3 * 64)  # 1 query head, 1 KV head, head_dim 64: [q | k | v]
    k_cache = torch.zeros(1, 8, 1, 64)
    v_cache = torch.zeros(1, 8, 1, 64)
    k_cache[0, :5, 0], v_cache[0, :5, 0] = qkv[:, 64:128], qkv[:, 128:]
    out = causal_prefill_attention(qkv, 1, 64, k_cache, v_cache, start=0, scale=0.125)
"""

from __future__ import annotations

import functools

import torch

from deepinfer_kernels.cpu.numpy_ops import NumpyKernels
from deepinfer_kernels.quant.blas_choice import default_blas_choice
from deepinfer_kernels.reference.cpu import causal_prefill_attention_reference


@functools.cache
def _kernels() -> NumpyKernels:
    return NumpyKernels()


def _kernel_applies(qkv: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> bool:
    return all(
        t.device.type == "cpu" and t.dtype == torch.float32 and t.is_contiguous()
        for t in (qkv, k_cache, v_cache)
    ) and not (torch.is_grad_enabled() and qkv.requires_grad)


def _check(
    qkv: torch.Tensor,
    num_heads: int,
    head_dim: int,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    start: int,
) -> None:
    if qkv.dim() != 2:
        raise ValueError(f"qkv: expected [T, columns], got shape {tuple(qkv.shape)}")
    if k_cache.dim() != 4 or k_cache.shape[-1] != head_dim:
        raise ValueError(f"k_cache: expected [blocks, block_size, Hkv, {head_dim}]")
    if v_cache.shape != k_cache.shape:
        raise ValueError(f"v_cache: expected k_cache's shape {tuple(k_cache.shape)}")
    hkv = k_cache.shape[2]
    if num_heads < 1 or num_heads % hkv:
        raise ValueError(f"num_heads: {num_heads} is not a multiple of the caches' {hkv}")
    if qkv.shape[1] < num_heads * head_dim:
        raise ValueError(f"qkv: expected at least {num_heads * head_dim} columns")
    slots = k_cache.shape[0] * k_cache.shape[1]
    if start < 0 or start + qkv.shape[0] > slots:
        raise ValueError(f"start: expected 0 <= start and start + {qkv.shape[0]} <= {slots} slots")


@torch.library.custom_op("deepinfer::causal_prefill_attention", mutates_args=())
def causal_prefill_attention_op(
    qkv: torch.Tensor,
    num_heads: int,
    head_dim: int,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    start: int,
    scale: float,
) -> torch.Tensor:
    _check(qkv, num_heads, head_dim, k_cache, v_cache, start)
    sgemm = default_blas_choice().in_region_sgemm()
    kernels = _kernels()
    if (
        sgemm is None
        or not _kernel_applies(qkv, k_cache, v_cache)
        or not kernels.causal_fn.available()
    ):
        return causal_prefill_attention_reference(
            qkv, num_heads, head_dim, k_cache, v_cache, start, scale
        )
    out = torch.empty(qkv.shape[0], num_heads, head_dim)
    with sgemm.one_thread() as address:
        kernels.causal_attention(
            qkv.detach().numpy(), num_heads, head_dim, k_cache.detach().numpy(),
            v_cache.detach().numpy(), out.numpy(), start=start, scale=scale, sgemm=address,
        )  # fmt: skip
    return out


@causal_prefill_attention_op.register_fake
def _(
    qkv: torch.Tensor,
    num_heads: int,
    head_dim: int,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    start: int,
    scale: float,
) -> torch.Tensor:
    return qkv.new_empty(qkv.shape[0], num_heads, head_dim)


def causal_prefill_attention(
    qkv: torch.Tensor,
    num_heads: int,
    head_dim: int,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    *,
    start: int,
    scale: float,
) -> torch.Tensor:
    """``torch.ops.deepinfer.causal_prefill_attention`` (see the module doc): fp32
    ``[T, num_heads, head_dim]``."""
    out: torch.Tensor = torch.ops.deepinfer.causal_prefill_attention(
        qkv, num_heads, head_dim, k_cache, v_cache, start, scale
    )
    return out
