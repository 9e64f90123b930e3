"""A tiny `SegmentDiskTier` and its pages, shared by the read-path tests (page pool, streams)."""

from __future__ import annotations

import torch

from deepinfer_cache import BlockMeta, SegmentDiskTier

PAGE = (2, 3, 4)  # 48 bytes of bf16: one 4 KiB slot per record


def key(i: int) -> bytes:
    return i.to_bytes(16, "little")


def page_of(i: int) -> torch.Tensor:
    return (torch.arange(24, dtype=torch.float32).reshape(PAGE) + 1000.0 * i).to(torch.bfloat16)


def open_tier(path, **kw) -> SegmentDiskTier:
    kw.setdefault("capacity_bytes", 1 << 24)
    kw.setdefault("segment_bytes", 8 * 4096)
    return SegmentDiskTier(path, PAGE, torch.bfloat16, **kw)


def fill(tier: SegmentDiskTier, ids) -> None:
    for i in ids:
        assert tier.put(key(i), page_of(i), BlockMeta(None, "chat", 4e9), block=True)
    assert tier.flush()
