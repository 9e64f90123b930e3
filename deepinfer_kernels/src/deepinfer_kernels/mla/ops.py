"""``torch.library`` custom ops for MLA attention and the latent-cache write, with fakes.

The ops take validated tensors and resolved options; users call the wrappers in
:mod:`deepinfer_kernels.mla.api`. ``num_splits <= 0`` lets the Triton path choose.
"""

from __future__ import annotations

import torch

from deepinfer_kernels.mla.torch_path import mla_attention_torch, write_latent_kv_torch


def mla_attention_impl(
    q_nope: torch.Tensor,
    q_rope: torch.Tensor,
    latent_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    scale: float,
    causal: bool,
    num_splits: int,
    use_triton: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    if use_triton:
        from deepinfer_kernels.mla.triton_mla import mla_attention_triton

        return mla_attention_triton(
            q_nope, q_rope, latent_cache, block_table, seq_lens, cu_seqlens_q,
            scale, causal, num_splits,
        )  # fmt: skip
    return mla_attention_torch(
        q_nope, q_rope, latent_cache, block_table, seq_lens, cu_seqlens_q, scale, causal
    )


mla_attention_op = torch.library.custom_op(
    "deepinfer::mla_paged_attention", mla_attention_impl, mutates_args=()
)


@mla_attention_op.register_fake
def _(
    q_nope: torch.Tensor,
    q_rope: torch.Tensor,
    latent_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    scale: float,
    causal: bool,
    num_splits: int,
    use_triton: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.empty_like(q_nope), q_nope.new_empty(q_nope.shape[:2], dtype=torch.float32)


def write_latent_kv_impl(
    kv_latent: torch.Tensor,
    k_rope: torch.Tensor,
    latent_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    write_latent_kv_torch(kv_latent, k_rope, latent_cache, slot_mapping)


write_latent_kv_op = torch.library.custom_op(
    "deepinfer::write_latent_kv", write_latent_kv_impl, mutates_args=("latent_cache",)
)


@write_latent_kv_op.register_fake
def _(
    kv_latent: torch.Tensor,
    k_rope: torch.Tensor,
    latent_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    return None
