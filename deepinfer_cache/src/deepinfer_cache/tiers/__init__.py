"""Storage tiers behind one ``Tier`` protocol: device pages, host memory, a disk directory."""

from .base import BlockMeta, GatherFn, ScatterFn, Tier, torch_gather, torch_scatter
from .device import DeviceTier
from .disk import DiskTier
from .host import HostTier

__all__ = [
    "BlockMeta",
    "DeviceTier",
    "DiskTier",
    "GatherFn",
    "HostTier",
    "ScatterFn",
    "Tier",
    "torch_gather",
    "torch_scatter",
]
