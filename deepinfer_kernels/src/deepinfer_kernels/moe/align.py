"""Sorting (token, slot) pairs by expert: the layout of the grouped expert GEMMs.

Pair ``p = token * top_k + slot`` goes to expert ``topk_ids.flatten()[p]``. Each expert's pairs
are laid out contiguously, in pair order, and its segment is padded to a multiple of
``block_m`` so that every ``block_m`` rows of the sorted layout belong to one expert. The
buffer has the static worst-case size ``P + E * (block_m - 1)`` rounded up to ``block_m``, so
building it needs no host sync (CUDA graphs, ``torch.compile``); padding rows hold ``P``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class ExpertLayout:
    """``sorted_pairs [padded_len]`` int32 (pair id or ``num_pairs`` for padding),
    ``block_expert [padded_len // block_m]`` int32 (expert of each row block, ``num_experts``
    for blocks past the end)."""

    sorted_pairs: torch.Tensor
    block_expert: torch.Tensor
    num_pairs: int
    block_m: int


def align_by_expert(topk_ids: torch.Tensor, num_experts: int, block_m: int) -> ExpertLayout:
    ids = topk_ids.reshape(-1).to(torch.int64)
    num_pairs = ids.numel()
    device = ids.device
    # Skipped pairs (-1) are counted in an extra bucket that gets no rows.
    bucket = torch.where(ids < 0, torch.full_like(ids, num_experts), ids)
    counts = torch.bincount(bucket, minlength=num_experts + 1)[:num_experts]
    padded = (counts + block_m - 1) // block_m * block_m
    seg_start = torch.cumsum(padded, 0) - padded
    pair_start = torch.cumsum(counts, 0) - counts
    order = torch.argsort(bucket, stable=True)
    sorted_bucket = bucket[order]
    valid = sorted_bucket < num_experts
    e = sorted_bucket.clamp(max=num_experts - 1)
    rank = torch.arange(num_pairs, device=device) - pair_start[e]
    dest = torch.where(valid, seg_start[e] + rank, torch.zeros_like(rank))
    total = num_pairs + num_experts * (block_m - 1)
    total = (total + block_m - 1) // block_m * block_m
    sorted_pairs = torch.full((total + 1,), num_pairs, dtype=torch.int64, device=device)
    # Invalid pairs go to the spare last slot, which is dropped.
    dest = torch.where(valid, dest, torch.full_like(dest, total))
    sorted_pairs.scatter_(0, dest, order)
    sorted_pairs = sorted_pairs[:total]
    seg_end = torch.cumsum(padded, 0)
    block_start = torch.arange(0, total, block_m, device=device)
    block_expert = torch.searchsorted(seg_end, block_start, right=True)
    return ExpertLayout(
        sorted_pairs.to(torch.int32), block_expert.to(torch.int32), num_pairs, block_m
    )
