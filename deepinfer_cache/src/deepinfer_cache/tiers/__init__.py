"""Storage tiers behind one ``Tier`` protocol: device pages, host memory, a disk directory
(one file per block, or segment files with a manifest)."""

from .base import BlockMeta, GatherFn, ScatterFn, Tier, torch_gather, torch_scatter
from .device import DeviceTier
from .disk import DiskTier
from .host import HostTier
from .segment_disk import SegmentCounters, SegmentDiskTier

__all__ = [
    "BlockMeta",
    "DeviceTier",
    "DiskTier",
    "GatherFn",
    "HostTier",
    "ScatterFn",
    "SegmentCounters",
    "SegmentDiskTier",
    "Tier",
    "torch_gather",
    "torch_scatter",
]
