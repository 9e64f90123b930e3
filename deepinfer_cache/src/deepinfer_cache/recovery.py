"""Rebuilding the index from a durable tier on open.

A block is re-indexed when its parent chain is complete and it has not expired
(``expires = max(header expiry, file mtime)``, see ``DiskTier.touch``). Blocks below a missing
parent (a crash between a child's and its parent's write) or below an expired block cannot be
reached by any lookup; they are deleted and counted as orphans. LRU order is restored from the
expiry times (older first; deeper first on ties, so leaves go before their ancestors).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from .index import PrefixIndex


def rebuild_index(index: PrefixIndex, tier_id: int, tier: Any, now: float) -> tuple[int, int]:
    """Restore ``tier.recovered()`` into ``index`` as tier ``tier_id``; returns
    ``(orphans_removed, expired_removed)``."""
    blocks = {b.key: b for b in tier.recovered()}
    children: dict[bytes | None, list[bytes]] = defaultdict(list)
    for b in blocks.values():
        children[b.meta.parent if b.meta.parent in blocks else None].append(b.key)
    orphans = expired = 0
    order: list[tuple[float, int, bytes]] = []
    stack = [(k, 0) for k in children[None]]
    while stack:
        key, depth = stack.pop()
        b = blocks[key]
        parent = b.meta.parent
        if parent is not None and (parent not in blocks or parent not in index):
            tier.delete(key)
            orphans += 1
            continue
        expires = max(b.meta.expires_at, b.mtime)
        if expires <= now or b.meta.retention not in index.retention.ttls:
            tier.delete(key)
            expired += 1
            continue
        index.restore(key, parent, tier_id, b.meta.retention, expires)
        order.append((expires, -depth, key))
        stack.extend((c, depth + 1) for c in children.get(key, ()))
    for key in blocks:
        if key not in index and key in tier:
            tier.delete(key)
            orphans += 1
    index.reorder_lru(tier_id, [k for _, _, k in sorted(order)])
    return orphans, expired
