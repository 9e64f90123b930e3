"""Small builders shared by the deepinfer_cache tests."""

from __future__ import annotations

import torch

from deepinfer_cache import (
    DeviceTier,
    DiskTier,
    HostTier,
    SegmentDiskTier,
    TieredKVStore,
    hash_token_blocks,
)

PAGE = (2, 4, 3)  # tiny pages: [K/V, block_size, head_dim]
BS = 4
PAGE_BYTES = 2 * 4 * 3 * 4


def page_for(h: bytes) -> torch.Tensor:
    """A page whose content is a function of its block hash (so mix-ups are visible)."""
    seed = int.from_bytes(h[:4], "little")
    return torch.arange(24, dtype=torch.float32).reshape(PAGE) + float(seed % 100_000)


def pages_for(tokens: list[int], ns: bytes = b"") -> torch.Tensor:
    hs = hash_token_blocks(tokens, BS, ns)
    return torch.stack([page_for(h) for h in hs]) if hs else torch.empty(0, *PAGE)


def make_store(
    tmp_path,
    device_pages: int = 2,
    host_pages: int = 2,
    disk_pages: int | None = 64,
    segments: bool = False,
    **kw,
) -> TieredKVStore:
    tiers: list = []
    if device_pages:
        tiers.append(DeviceTier.allocate(PAGE, torch.float32, device_pages * PAGE_BYTES))
    if host_pages:
        tiers.append(HostTier(PAGE, torch.float32, host_pages * PAGE_BYTES))
    if disk_pages is not None and segments:  # 4 KiB records, 4 per segment
        tiers.append(
            SegmentDiskTier(
                tmp_path,
                PAGE,
                torch.float32,
                disk_pages * 4096,
                fsync=False,
                segment_bytes=4 * 4096,
            )
        )
    elif disk_pages is not None:
        tiers.append(
            DiskTier(tmp_path, PAGE, torch.float32, disk_pages * (PAGE_BYTES + 512), fsync=False)
        )
    return TieredKVStore(tiers, BS, **kw)
