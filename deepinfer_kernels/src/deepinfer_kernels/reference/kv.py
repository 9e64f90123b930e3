"""Readable loops for KV page movement: the specification of ``write_kv`` and the block moves."""

from __future__ import annotations

import torch


def write_kv_reference(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """For each token ``t`` with ``s = slot_mapping[t] >= 0``: ``k_cache[s // bs, s % bs] = k[t]``
    (same for v), where ``bs = k_cache.shape[1]``. Slot -1 is skipped."""
    block_size = k_cache.shape[1]
    for t in range(k.shape[0]):
        s = int(slot_mapping[t])
        if s < 0:
            continue
        k_cache[s // block_size, s % block_size] = k[t]
        v_cache[s // block_size, s % block_size] = v[t]


def gather_blocks_reference(
    cache: torch.Tensor, block_ids: torch.Tensor, block_dim: int = 0
) -> torch.Tensor:
    """``out.select(block_dim, i) == cache.select(block_dim, block_ids[i])`` for every ``i``."""
    pieces = [cache.select(block_dim, int(b)) for b in block_ids]
    if not pieces:
        shape = list(cache.shape)
        shape[block_dim] = 0
        return cache.new_empty(shape)
    return torch.stack(pieces, dim=block_dim)


def scatter_blocks_reference(
    cache: torch.Tensor, block_ids: torch.Tensor, src: torch.Tensor, block_dim: int = 0
) -> None:
    """``cache.select(block_dim, block_ids[i]) = src.select(block_dim, i)`` for every ``i``."""
    for i, b in enumerate(block_ids.tolist()):
        cache.select(block_dim, int(b)).copy_(src.select(block_dim, i))
