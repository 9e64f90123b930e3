"""Multi-head latent attention (DeepSeek-V2/V3 MLA) over a paged latent cache.

Example::

    import torch
    from deepinfer_kernels.mla import mla_paged_attention, write_latent_kv

    rank, rope, heads = 64, 16, 4
    cache = torch.zeros(8, 16, rank + rope)  # [num_blocks, block_size, rank + rope]
    slots = torch.arange(20, dtype=torch.int32) + 3 * 16  # positions 0..19 from block 3 on
    write_latent_kv(torch.randn(20, rank), torch.randn(20, rope), cache, slots)
    out = mla_paged_attention(
        torch.randn(2, heads, rank), torch.randn(2, heads, rope), cache,
        block_table=torch.tensor([[3, 4]], dtype=torch.int32),
        seq_lens=torch.tensor([20], dtype=torch.int32),
        cu_seqlens_q=torch.tensor([0, 2], dtype=torch.int32),  # a 2-token verification
        scale=(128 + rope) ** -0.5,
    )  # [2, heads, rank]
"""

from deepinfer_kernels.mla.api import mla_decode_attention, mla_paged_attention, write_latent_kv

__all__ = ["mla_decode_attention", "mla_paged_attention", "write_latent_kv"]
