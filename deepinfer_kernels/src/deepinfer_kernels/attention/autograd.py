"""Backward of paged attention, the same on every path: through the reference.

The forward kernels (torch tiles, Triton unified, Triton split-K decode) keep no softmax
statistics for a backward pass, and a hand-written backward kernel for every layout is not worth
it for an inference library. Instead the gradient is the reference's: the backward recomputes
``reference.paged_attention`` with autograd on and differentiates it, so eager torch, eager
Triton and ``torch.compile`` (through ``torch.ops.deepinfer.paged_attention_backward``, an
opaque op with a fake) give the same gradients for ``q``, ``k_cache`` and ``v_cache``. It is
dense and loops over sequences: fine for fine-tuning a drafter or checking a model, slow for
training at scale. ``block_table``, ``seq_lens`` and ``cu_seqlens_q`` get no gradient.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

Impl = Callable[..., tuple[torch.Tensor, torch.Tensor]]


def needs_grad(*tensors: torch.Tensor) -> bool:
    """Whether autograd will want a backward from an op over ``tensors``."""
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


def _backward_impl(
    grad_out: torch.Tensor,
    grad_lse: torch.Tensor,
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    scale: float,
    causal: bool,
    window: int,
    soft_cap: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    # Imported here: reference/__init__ pulls in modules that import the attention package.
    from deepinfer_kernels.reference.attention import paged_attention as reference

    def forward(
        qq: torch.Tensor, kk: torch.Tensor, vv: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        out, lse = reference(
            qq, kk, vv, block_table, seq_lens, cu_seqlens_q,
            scale=scale, causal=causal, sliding_window=window if window > 0 else None,
            soft_cap=soft_cap if soft_cap > 0 else None, return_lse=True,
        )  # fmt: skip
        return out, lse

    # torch.func.vjp rather than torch.autograd.grad: inside a custom op (the compiled
    # backward) the autograd dispatch keys are excluded, and functorch's transform still works.
    with torch.enable_grad():
        primal = torch.func.vjp(forward, q.detach(), k_cache.detach(), v_cache.detach())
        (out, lse), vjp = primal[0], primal[1]
        # Rows without keys have lse = -inf: their outputs are constant 0, so no gradient.
        grad_lse = torch.where(torch.isfinite(lse), grad_lse, 0.0)
        grads = vjp((grad_out.to(out.dtype), grad_lse))
    dq, dk, dv = (torch.nan_to_num(g) for g in grads)
    return dq, dk, dv


paged_attention_backward_op = torch.library.custom_op(
    "deepinfer::paged_attention_backward", _backward_impl, mutates_args=()
)


@paged_attention_backward_op.register_fake
def _(
    grad_out: torch.Tensor,
    grad_lse: torch.Tensor,
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    scale: float,
    causal: bool,
    window: int,
    soft_cap: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return torch.empty_like(q), torch.empty_like(k_cache), torch.empty_like(v_cache)


def _backward(
    saved: tuple[torch.Tensor, ...], meta: tuple[float, bool, int, float], g_out: Any, g_lse: Any
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    q, k_cache, v_cache, block_table, seq_lens, cu = saved
    g_out = torch.zeros_like(q) if g_out is None else g_out
    g_lse = q.new_zeros(q.shape[:2], dtype=torch.float32) if g_lse is None else g_lse
    backward = paged_attention_backward_op if torch.compiler.is_compiling() else _backward_impl
    return backward(g_out, g_lse, q, k_cache, v_cache, block_table, seq_lens, cu, *meta)


class PagedAttentionFunction(torch.autograd.Function):
    """Eager forward through any path's implementation, backward through the reference."""

    @staticmethod
    def forward(
        ctx: Any,
        impl: Impl,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        block_table: torch.Tensor,
        seq_lens: torch.Tensor,
        cu_seqlens_q: torch.Tensor,
        meta: tuple[float, bool, int, float],
    ) -> tuple[torch.Tensor, torch.Tensor]:
        ctx.save_for_backward(q, k_cache, v_cache, block_table, seq_lens, cu_seqlens_q)
        ctx.meta = meta
        with torch.no_grad():
            return impl()

    @staticmethod
    def backward(ctx: Any, g_out: Any, g_lse: Any) -> tuple[Any, ...]:
        dq, dk, dv = _backward(ctx.saved_tensors, ctx.meta, g_out, g_lse)
        return None, dq, dk, dv, None, None, None, None


def with_reference_backward(
    impl: Impl,
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    *,
    scale: float,
    causal: bool,
    window: int,
    soft_cap: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``impl()`` (a forward of these inputs on any path), differentiable when autograd wants
    it: then the backward is the reference's."""
    if not needs_grad(q, k_cache, v_cache):
        return impl()
    out, lse = PagedAttentionFunction.apply(  # type: ignore[no-untyped-call]
        impl, q, k_cache, v_cache, block_table, seq_lens, cu_seqlens_q,
        (scale, causal, window, soft_cap),
    )  # fmt: skip
    return out, lse


def _setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
    q, k_cache, v_cache, block_table, seq_lens, cu, scale, causal, window, cap, _ = inputs
    ctx.save_for_backward(q, k_cache, v_cache, block_table, seq_lens, cu)
    ctx.meta = (scale, causal, window, cap)


def _op_backward(ctx: Any, g_out: Any, g_lse: Any) -> tuple[Any, ...]:
    dq, dk, dv = _backward(ctx.saved_tensors, ctx.meta, g_out, g_lse)
    return dq, dk, dv, None, None, None, None, None, None, None, None


def register_paged_attention_autograd(op: Any) -> None:
    """Give ``torch.ops.deepinfer.paged_attention`` the reference backward (traced callers)."""
    op.register_autograd(_op_backward, setup_context=_setup_context)


def _decode_setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
    q, k_cache, v_cache, block_table, seq_lens, scale, window, cap, _, _ = inputs
    cu = torch.arange(q.shape[0] + 1, dtype=torch.int32, device=q.device)
    ctx.save_for_backward(q, k_cache, v_cache, block_table, seq_lens, cu)
    ctx.meta = (scale, True, window, cap)


def _decode_op_backward(ctx: Any, g_out: Any, g_lse: Any) -> tuple[Any, ...]:
    dq, dk, dv = _backward(ctx.saved_tensors, ctx.meta, g_out, g_lse)
    return dq, dk, dv, None, None, None, None, None, None, None


def register_paged_decode_attention_autograd(op: Any) -> None:
    """The same for ``torch.ops.deepinfer.paged_decode_attention`` (one causal query each)."""
    op.register_autograd(_decode_op_backward, setup_context=_decode_setup_context)
