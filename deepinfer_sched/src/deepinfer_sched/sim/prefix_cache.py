"""LRU prefix cache over chained block ids, used per instance and as the shared SSD tier."""

from __future__ import annotations

from collections import OrderedDict

__all__ = ["LRUBlockCache"]


class LRUBlockCache:
    """A set of block ids with least-recently-used eviction and a capacity in blocks.

    ``insert`` touches a prompt's blocks from the last to the first, so a block is always at
    least as recent as every later block of any prompt containing it. LRU therefore evicts
    leaves before their prefixes and the cached set stays prefix-closed, which lets
    ``prefix_hits`` binary-search (O(log n) look-ups) instead of scanning.
    """

    __slots__ = ("_d", "capacity", "evictions")

    def __init__(self, capacity: int) -> None:
        if capacity < 0:
            raise ValueError(f"capacity must be >= 0, got {capacity}")
        self.capacity = capacity
        self.evictions = 0
        self._d: OrderedDict[int, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._d)

    def __contains__(self, block: int) -> bool:
        return block in self._d

    def prefix_hits(self, hashes: tuple[int, ...]) -> int:
        """Number of leading ``hashes`` cached (does not change the LRU order)."""
        d = self._d
        lo, hi = 0, len(hashes)
        while lo < hi:
            mid = (lo + hi) >> 1
            if hashes[mid] in d:
                lo = mid + 1
            else:
                hi = mid
        return lo

    def insert(self, hashes: tuple[int, ...]) -> None:
        """Cache (or refresh) every block of a prompt, evicting the least recent beyond
        capacity."""
        if self.capacity == 0:
            return
        d = self._d
        move = d.move_to_end
        for h in reversed(hashes):
            if h in d:
                move(h)
            else:
                d[h] = None
        excess = len(d) - self.capacity
        if excess > 0:
            self.evictions += excess
            pop = d.popitem
            for _ in range(excess):
                pop(last=False)
