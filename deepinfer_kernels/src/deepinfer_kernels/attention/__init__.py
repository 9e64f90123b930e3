"""Paged attention: unified ragged op, split-K decode and attention-state merging.

Example::

    import torch
    from deepinfer_kernels.attention import paged_attention

    k = torch.randn(8, 16, 2, 64)  # [num_blocks, block_size, num_kv_heads, head_dim]
    v = torch.randn(8, 16, 2, 64)
    q = torch.randn(3, 4, 64)  # one decode token + a 2-token verification
    out = paged_attention(
        q, k, v,
        block_table=torch.tensor([[3, 1], [5, 0]], dtype=torch.int32),
        seq_lens=torch.tensor([20, 9], dtype=torch.int32),
        cu_seqlens_q=torch.tensor([0, 1, 3], dtype=torch.int32),
    )
"""

from deepinfer_kernels.attention.api import (
    merge_attention_states,
    paged_attention,
    paged_decode_attention,
)
from deepinfer_kernels.attention.plan import PagedAttentionPlan, plan_paged_attention
from deepinfer_kernels.attention.splits import choose_num_splits

__all__ = [
    "PagedAttentionPlan",
    "choose_num_splits",
    "merge_attention_states",
    "paged_attention",
    "paged_decode_attention",
    "plan_paged_attention",
]
