"""``write_kv``: store new keys and values into the paged cache (public op)."""

from __future__ import annotations

from typing import Any

import torch

from deepinfer_kernels._dispatch import eager_or_op, should_use_triton
from deepinfer_kernels._interop import to_torch
from deepinfer_kernels.kv.validate import check_slot_values, check_write_kv
from deepinfer_kernels.verify.validate import want_value_checks


def _slot_view(cache: torch.Tensor) -> torch.Tensor | None:
    """``cache`` as ``[num_blocks * block_size, ...]`` when that is a view (dims 0 and 1 merge),
    else ``None``."""
    if cache.shape[0] > 1 and cache.stride(0) != cache.shape[1] * cache.stride(1):
        return None
    return cache.view(cache.shape[0] * cache.shape[1], *cache.shape[2:])


def copy_rows(
    k: torch.Tensor,
    v: torch.Tensor,
    k_flat: torch.Tensor,
    v_flat: torch.Tensor,
    slots: torch.Tensor,
) -> None:
    """Every slot written: one row copy per flattened cache (``slots`` int64, all in range)."""
    k_flat.index_copy_(0, slots, k.to(k_flat.dtype))
    v_flat.index_copy_(0, slots, v.to(v_flat.dtype))


def write_kv_torch(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    block_size = k_cache.shape[1]
    num_slots = k_cache.shape[0] * block_size
    s = slot_mapping.to(torch.int64)
    if s.numel() == 0:
        return
    k_flat, v_flat = _slot_view(k_cache), _slot_view(v_cache)
    if k_flat is not None and v_flat is not None:
        lo, hi = torch.aminmax(s)
        if int(lo) >= 0 and int(hi) < num_slots:
            # Every slot is written (the usual case): no masking.
            copy_rows(k, v, k_flat, v_flat, s)
            return
    # Out-of-range slots are skipped like -1, so an unchecked call can never write out of bounds.
    valid = (s >= 0) & (s < num_slots)
    slots = s[valid]
    blocks, offsets = slots // block_size, slots % block_size
    k_cache[blocks, offsets] = k[valid].to(k_cache.dtype)
    v_cache[blocks, offsets] = v[valid].to(v_cache.dtype)


def _write_kv_impl(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    use_triton: bool,
) -> None:
    if use_triton:
        from deepinfer_kernels.kv.triton_kv import write_kv_triton

        write_kv_triton(k, v, k_cache, v_cache, slot_mapping)
        return
    write_kv_torch(k, v, k_cache, v_cache, slot_mapping)


_write_kv_op = torch.library.custom_op(
    "deepinfer::write_kv", _write_kv_impl, mutates_args=("k_cache", "v_cache")
)


@_write_kv_op.register_fake
def _(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    use_triton: bool,
) -> None:
    return None


def write_kv(
    k: Any,
    v: Any,
    k_cache: Any,
    v_cache: Any,
    slot_mapping: Any,
    *,
    use_triton: bool | None = None,
    check_values: bool = True,
) -> None:
    """In place: for each token ``t`` with ``s = slot_mapping[t] >= 0``,
    ``k_cache[s // block_size, s % block_size] = k[t]`` and the same for ``v``.

    ``k``, ``v``: ``[T, ...]`` (usually ``[T, num_kv_heads, head_dim]``); ``k_cache``,
    ``v_cache``: ``[num_blocks, block_size, ...]`` with matching trailing dims (``v`` may have a
    different head dim from ``k``); ``slot_mapping``: ``[T]`` int (``block * block_size +
    offset``, -1 = skip). Values are cast to the cache dtype. With ``check_values`` a slot
    outside ``[-1, num_blocks * block_size)`` or a repeated slot raises ``ValueError``; without
    it, out-of-range slots are skipped (never written out of bounds) and which of two writes to
    one slot wins is undefined. DLPack arrays are written in place through shared memory.
    """
    k_t, v_t = to_torch(k, "k"), to_torch(v, "v")
    kc, vc = to_torch(k_cache, "k_cache"), to_torch(v_cache, "v_cache")
    slots = to_torch(slot_mapping, "slot_mapping")
    check_write_kv(k_t, v_t, kc, vc, slots)
    if want_value_checks(check_values):
        check_slot_values(slots, kc.shape[0] * kc.shape[1])
    triton = should_use_triton(kc.device, use_triton)
    eager_or_op(_write_kv_op, _write_kv_impl)(k_t, v_t, kc, vc, slots, triton)
