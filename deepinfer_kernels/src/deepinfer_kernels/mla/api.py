"""Public MLA ops: validation, DLPack interop and dispatch around the custom ops.

Layout (DeepSeek-V2/V3): ``latent_cache [num_blocks, block_size, kv_lora_rank + rope_dim]``
holds ``[c_kv | k_rope]`` per position, one latent head shared by every query head;
``block_table`` int32 ``[batch, max_blocks]``; ``seq_lens`` int32 ``[batch]`` counts cached
positions including the new tokens; ``cu_seqlens_q`` int32 ``[batch + 1]``; the queries of a
sequence are its last ``q_len`` positions.
"""

from __future__ import annotations

from typing import Any

import torch

from deepinfer_kernels._dispatch import eager_or_op, should_use_triton
from deepinfer_kernels._interop import result_converter, to_torch
from deepinfer_kernels.mla.ops import (
    mla_attention_impl,
    mla_attention_op,
    write_latent_kv_impl,
    write_latent_kv_op,
)
from deepinfer_kernels.mla.validate import (
    check_mla_shapes,
    check_mla_values,
    check_scale,
    check_slot_values,
    check_write_latent,
    want_value_checks,
)


def mla_paged_attention(
    q_nope_absorbed: Any,
    q_rope: Any,
    latent_cache: Any,
    block_table: Any,
    seq_lens: Any,
    cu_seqlens_q: Any,
    *,
    scale: float,
    causal: bool = True,
    return_lse: bool = False,
    num_splits: int | None = None,
    use_triton: bool | None = None,
    check_values: bool = True,
) -> Any:
    """Multi-head latent attention of ragged queries (decode, verify, extend) over the cache.

    ``q_nope_absorbed [total_q, H, kv_lora_rank]`` is the no-rope query with the key
    up-projection absorbed, ``q_rope [total_q, H, rope_dim]`` the rotary part. With
    ``s_j = scale * (<q_nope_absorbed, c_kv_j> + <q_rope, k_rope_j>)`` over the kept positions
    (``j < seq_len``, ``j <= p`` if causal) the output is ``sum_j softmax(s)_j c_kv_j``,
    ``[total_q, H, kv_lora_rank]`` in the query dtype (apply ``W_UV`` after). ``scale`` has no
    default: DeepSeek models use ``qk_head_dim ** -0.5`` (times the YaRN factor), not the
    latent width. ``return_lse`` adds ``lse [total_q, H]`` (fp32, natural log).

    The Triton path splits each row's keys into ``num_splits`` chunks attended in parallel and
    merged by log-sum-exp (``None``: chosen from the sizes); the torch path is exact and does
    not split. ``check_values=False`` skips the data-dependent checks (a host sync on CUDA).
    """
    convert = result_converter(q_nope_absorbed, q_rope, latent_cache)
    qn, qr = to_torch(q_nope_absorbed, "q_nope_absorbed"), to_torch(q_rope, "q_rope")
    cache = to_torch(latent_cache, "latent_cache")
    bt, lens = to_torch(block_table, "block_table"), to_torch(seq_lens, "seq_lens")
    cu = to_torch(cu_seqlens_q, "cu_seqlens_q")
    shape = check_mla_shapes(qn, qr, cache, bt, lens, cu)
    scale = check_scale(scale)
    if not isinstance(causal, bool):
        raise TypeError(f"causal: expected a bool, got {type(causal)!r}")
    if not isinstance(return_lse, bool):
        raise TypeError(f"return_lse: expected a bool, got {type(return_lse)!r}")
    if num_splits is not None and (
        isinstance(num_splits, bool) or not isinstance(num_splits, int) or num_splits < 1
    ):
        raise ValueError(f"num_splits: expected an int >= 1 or None, got {num_splits!r}")
    if want_value_checks(check_values):
        check_mla_values(shape, bt, lens, cu)
    triton = should_use_triton(qn.device, use_triton)
    out, lse = eager_or_op(mla_attention_op, mla_attention_impl)(
        qn, qr, cache, bt, lens, cu, scale, causal, num_splits or 0, triton
    )
    return (convert(out), convert(lse)) if return_lse else convert(out)


def mla_decode_attention(
    q_nope_absorbed: Any,
    q_rope: Any,
    latent_cache: Any,
    block_table: Any,
    seq_lens: Any,
    *,
    scale: float,
    return_lse: bool = False,
    num_splits: int | None = None,
    use_triton: bool | None = None,
    check_values: bool = True,
) -> Any:
    """:func:`mla_paged_attention` with one query per sequence (``q_* [batch, H, ...]``)."""
    qn = to_torch(q_nope_absorbed, "q_nope_absorbed")
    device = qn.device if isinstance(qn, torch.Tensor) else None
    batch = qn.shape[0] if isinstance(qn, torch.Tensor) and qn.dim() >= 1 else 0
    cu = torch.arange(batch + 1, dtype=torch.int32, device=device)
    return mla_paged_attention(
        q_nope_absorbed, q_rope, latent_cache, block_table, seq_lens, cu,
        scale=scale, causal=True, return_lse=return_lse, num_splits=num_splits,
        use_triton=use_triton, check_values=check_values,
    )  # fmt: skip


def write_latent_kv(
    kv_latent: Any,
    k_rope: Any,
    latent_cache: Any,
    slot_mapping: Any,
    *,
    check_values: bool = True,
) -> None:
    """Store ``[kv_latent | k_rope]`` (``[tokens, kv_lora_rank]``, ``[tokens, rope_dim]``)
    into ``latent_cache`` in place at flat slots ``slot_mapping [tokens]`` (``block * block_size
    + offset``; ``-1`` skips the token), cast to the cache dtype. Out-of-range slots are an
    error when checked, skipped (never written) when ``check_values=False``."""
    kv, kr = to_torch(kv_latent, "kv_latent"), to_torch(k_rope, "k_rope")
    cache, slots = to_torch(latent_cache, "latent_cache"), to_torch(slot_mapping, "slot_mapping")
    check_write_latent(kv, kr, cache, slots)
    if want_value_checks(check_values):
        check_slot_values(slots, cache.shape[0] * cache.shape[1])
    eager_or_op(write_latent_kv_op, write_latent_kv_impl)(kv, kr, cache, slots)
