"""``torch.library`` custom ops for paged attention, with fake implementations.

The ops take already-validated tensors and resolved options (``sliding_window=-1`` and
``soft_cap=0`` mean off; ``use_triton`` is decided by the public wrapper), so they trace
cleanly under ``torch.compile`` and can be captured in CUDA graphs. Users call the public
wrappers in :mod:`deepinfer_kernels.attention.api`.
"""

from __future__ import annotations

import torch

from deepinfer_kernels.attention.autograd import (
    register_paged_attention_autograd,
    register_paged_decode_attention_autograd,
)
from deepinfer_kernels.attention.merge import merge_attention_states_torch
from deepinfer_kernels.attention.torch_path import paged_attention_torch


def paged_attention_impl(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    scale: float,
    causal: bool,
    sliding_window: int,
    soft_cap: float,
    use_triton: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    if use_triton:
        from deepinfer_kernels.attention.triton_unified import paged_attention_triton

        return paged_attention_triton(
            q, k_cache, v_cache, block_table, seq_lens, cu_seqlens_q,
            scale, causal, sliding_window, soft_cap,
        )  # fmt: skip
    return paged_attention_torch(
        q, k_cache, v_cache, block_table, seq_lens, cu_seqlens_q,
        scale, causal, sliding_window, soft_cap,
    )  # fmt: skip


paged_attention_op = torch.library.custom_op(
    "deepinfer::paged_attention", paged_attention_impl, mutates_args=()
)
register_paged_attention_autograd(paged_attention_op)


@paged_attention_op.register_fake
def _(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    scale: float,
    causal: bool,
    sliding_window: int,
    soft_cap: float,
    use_triton: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.empty_like(q), q.new_empty(q.shape[:2], dtype=torch.float32)


def paged_decode_attention_impl(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    sliding_window: int,
    soft_cap: float,
    num_splits: int,
    use_triton: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    if use_triton:
        from deepinfer_kernels.attention.triton_decode import paged_decode_attention_triton

        return paged_decode_attention_triton(
            q, k_cache, v_cache, block_table, seq_lens, scale, sliding_window, soft_cap, num_splits
        )
    # The torch path is exact; splitting the keys would only add work on CPU.
    cu = torch.arange(q.shape[0] + 1, dtype=torch.int32, device=q.device)
    return paged_attention_torch(
        q, k_cache, v_cache, block_table, seq_lens, cu, scale, True, sliding_window, soft_cap
    )


paged_decode_attention_op = torch.library.custom_op(
    "deepinfer::paged_decode_attention", paged_decode_attention_impl, mutates_args=()
)
register_paged_decode_attention_autograd(paged_decode_attention_op)


@paged_decode_attention_op.register_fake
def _(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    sliding_window: int,
    soft_cap: float,
    num_splits: int,
    use_triton: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.empty_like(q), q.new_empty(q.shape[:2], dtype=torch.float32)


def merge_attention_states_impl(
    o_a: torch.Tensor,
    lse_a: torch.Tensor,
    o_b: torch.Tensor,
    lse_b: torch.Tensor,
    use_triton: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    if use_triton:
        from deepinfer_kernels.attention.triton_decode import merge_attention_states_triton

        return merge_attention_states_triton(o_a, lse_a, o_b, lse_b)
    return merge_attention_states_torch(o_a, lse_a, o_b, lse_b)


merge_attention_states_op = torch.library.custom_op(
    "deepinfer::merge_attention_states", merge_attention_states_impl, mutates_args=()
)


@merge_attention_states_op.register_fake
def _(
    o_a: torch.Tensor,
    lse_a: torch.Tensor,
    o_b: torch.Tensor,
    lse_b: torch.Tensor,
    use_triton: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.empty_like(o_a), lse_a.new_empty(lse_a.shape, dtype=torch.float32)
