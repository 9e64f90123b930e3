"""Rebuilding the index from a durable tier on open.

A block is re-indexed when its parent chain is complete and it has not expired
(``expires = max(header expiry, file mtime)``, see ``DiskTier.touch``). Blocks below a missing
parent (a crash between a child's and its parent's write) cannot be reached by any lookup; they
are deleted and counted as orphans. Blocks below an expired block are deleted with it and
counted as expired. A block of a retention class the current policy does not name is kept until
its stored expiry (the store warns): changing the policy never deletes data by itself. LRU order
is restored from the expiry times (older first; deeper first on ties, so leaves go before their
ancestors).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from .index import PrefixIndex
from .index_bulk import bulk_load, paused_gc


@dataclass
class RebuildReport:
    orphans: int = 0
    expired: int = 0
    unknown_blocks: int = 0
    unknown_classes: set[str] = field(default_factory=set)
    tenants: dict[bytes, bytes] = field(default_factory=dict)  # first block -> tenant tag


def rebuild_index(index: PrefixIndex, tier_id: int, tier: Any, now: float) -> RebuildReport:
    """Restore ``tier.recovered()`` into ``index`` as tier ``tier_id`` (column-wise through
    ``index_bulk`` when the index is empty and the tier offers ``recovered_columns``)."""
    rep = RebuildReport()
    if not len(index) and hasattr(tier, "recovered_columns"):
        with paused_gc():
            res = bulk_load(index, tier_id, tier.recovered_columns(), now)
        for key in res.orphans:
            tier.delete(key)
        for key in res.expired:
            tier.delete(key)
        rep.orphans, rep.expired = len(res.orphans), len(res.expired)
        rep.unknown_blocks = sum(res.unknown.values())
        rep.unknown_classes = set(res.unknown)
        rep.tenants = res.tenants
        return rep
    blocks = {b.key: b for b in tier.recovered()}
    children: dict[bytes | None, list[bytes]] = defaultdict(list)
    for b in blocks.values():
        children[b.meta.parent if b.meta.parent in blocks else None].append(b.key)
    known = index.retention.ttls
    order: list[tuple[float, int, bytes]] = []
    # (key, depth, an ancestor expired): the subtree of an expired block goes with it.
    stack = [(k, 0, False) for k in children[None]]
    while stack:
        key, depth, dead = stack.pop()
        b = blocks[key]
        parent = b.meta.parent
        if not dead and parent is not None and (parent not in blocks or parent not in index):
            tier.delete(key)
            rep.orphans += 1
            continue
        expires = max(b.meta.expires_at, b.mtime)
        if dead or expires <= now:
            tier.delete(key)
            rep.expired += 1
            stack.extend((c, depth + 1, True) for c in children.get(key, ()))
            continue
        if b.meta.retention not in known:
            rep.unknown_blocks += 1
            rep.unknown_classes.add(b.meta.retention)
        index.restore(key, parent, tier_id, b.meta.retention, expires)
        if parent is None and b.meta.tenant is not None:
            rep.tenants[key] = b.meta.tenant
        order.append((expires, -depth, key))
        stack.extend((c, depth + 1, False) for c in children.get(key, ()))
    for key in blocks:
        if key not in index and key in tier:
            tier.delete(key)
            rep.orphans += 1
    index.reorder_lru(tier_id, [k for _, _, k in sorted(order)])
    return rep
