"""Storage tiers behind one ``Tier`` protocol: device pages, host memory, a disk directory
(one file per block, or segment files with a manifest)."""

from .base import BlockMeta, GatherFn, ScatterFn, Tier, torch_gather, torch_scatter
from .device import DeviceTier
from .disk import DiskTier
from .disk_formats import (
    DISK_FORMATS,
    CacheFormatError,
    MigrationReport,
    migrate_files_to_segments,
)
from .host import HostTier
from .segment_disk import SegmentCounters, SegmentDiskTier

__all__ = [
    "DISK_FORMATS",
    "BlockMeta",
    "CacheFormatError",
    "DeviceTier",
    "DiskTier",
    "GatherFn",
    "HostTier",
    "MigrationReport",
    "ScatterFn",
    "SegmentCounters",
    "SegmentDiskTier",
    "Tier",
    "migrate_files_to_segments",
    "torch_gather",
    "torch_scatter",
]
