"""Argument checks for the KV movement ops.

Structure is always checked. Value checks (slot and block ids in range, no duplicates) read the
ids, which synchronises on CUDA; they run when ``check_values`` is true and are skipped while
``torch.compile`` traces. The kernels never write out of bounds either way: out-of-range slots
are skipped by the Triton path.
"""

from __future__ import annotations

import torch

from deepinfer_kernels.verify.validate import check_int_tensor


def normalize_dim(block_dim: int, ndim: int) -> int:
    if not isinstance(block_dim, int) or isinstance(block_dim, bool):
        raise TypeError(f"block_dim: expected an int, got {type(block_dim)!r}")
    if not -ndim <= block_dim < ndim:
        raise ValueError(f"block_dim: expected a value in [{-ndim}, {ndim}), got {block_dim}")
    return block_dim % ndim


def check_write_kv(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    for name, t in (("k", k), ("v", v), ("k_cache", k_cache), ("v_cache", v_cache)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: expected a tensor, got {type(t)!r}")
    if k_cache.dim() < 3 or v_cache.dim() != k_cache.dim():
        raise ValueError(
            "k_cache/v_cache: expected [num_blocks, block_size, ...] with the same rank, got "
            f"{tuple(k_cache.shape)} and {tuple(v_cache.shape)}"
        )
    if k_cache.shape[:2] != v_cache.shape[:2]:
        raise ValueError("v_cache: num_blocks and block_size must match k_cache")
    if tuple(k.shape[1:]) != tuple(k_cache.shape[2:]):
        raise ValueError(
            f"k: expected shape [T, {', '.join(map(str, k_cache.shape[2:]))}], got {tuple(k.shape)}"
        )
    if tuple(v.shape[1:]) != tuple(v_cache.shape[2:]) or v.shape[0] != k.shape[0]:
        raise ValueError(
            f"v: expected shape [{k.shape[0]}, {', '.join(map(str, v_cache.shape[2:]))}], "
            f"got {tuple(v.shape)}"
        )
    check_int_tensor(slot_mapping, "slot_mapping", 1)
    if slot_mapping.shape[0] != k.shape[0]:
        raise ValueError(
            f"slot_mapping: expected shape ({k.shape[0]},), got {tuple(slot_mapping.shape)}"
        )
    for name, t in (
        ("v", v),
        ("k_cache", k_cache),
        ("v_cache", v_cache),
        ("slot_mapping", slot_mapping),
    ):
        if t.device != k.device:
            raise ValueError(f"{name}: expected device {k.device}, got {t.device}")


def check_slot_values(slot_mapping: torch.Tensor, num_slots: int) -> None:
    if slot_mapping.numel() == 0:
        return
    s = slot_mapping.to(torch.int64)
    if bool(((s < -1) | (s >= num_slots)).any()):
        raise ValueError(f"slot_mapping: every entry must be -1 or lie in [0, {num_slots})")
    used = s[s >= 0]
    if used.numel() != torch.unique(used).numel():
        raise ValueError("slot_mapping: a slot appears twice (which write wins would be undefined)")


def check_block_ids(
    cache: torch.Tensor, block_ids: torch.Tensor, block_dim: int, unique: bool, check_values: bool
) -> None:
    if not isinstance(cache, torch.Tensor):
        raise TypeError(f"cache: expected a tensor, got {type(cache)!r}")
    check_int_tensor(block_ids, "block_ids", 1)
    if block_ids.device != cache.device:
        raise ValueError(f"block_ids: expected device {cache.device}, got {block_ids.device}")
    if not check_values or block_ids.numel() == 0:
        return
    num_blocks = cache.shape[block_dim]
    ids = block_ids.to(torch.int64)
    if bool(((ids < 0) | (ids >= num_blocks)).any()):
        raise ValueError(f"block_ids: every entry must lie in [0, {num_blocks})")
    if unique and ids.numel() != torch.unique(ids).numel():
        raise ValueError("block_ids: a block appears twice (which write wins would be undefined)")
