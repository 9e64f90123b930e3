"""``BlockMeta``: what a durable tier records next to a page so the index can be rebuilt."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class BlockMeta:
    """``parent`` is the previous block's hash (None for a first block); ``expires_at`` is
    wall-clock seconds since the epoch; ``tenant`` is the 16-byte tag of the namespace a first
    block was stored under (``hashing.tenant_tag``; None for other blocks and old files), so
    ``TieredKVStore.delete_namespace`` can find a tenant's blocks after a restart."""

    parent: bytes | None
    retention: str
    expires_at: float
    tenant: bytes | None = None


@dataclass(frozen=True)
class RecoveredBlock:
    """A block a durable tier found intact on open; ``mtime`` holds its latest persisted
    expiry (``DiskTier.touch``)."""

    key: bytes
    meta: BlockMeta
    mtime: float
