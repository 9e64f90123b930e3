"""LRU prefix cache over chained block ids, used per instance and as the shared SSD tier."""

from __future__ import annotations

from collections import OrderedDict, deque
from itertools import repeat

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
        capacity.

        Because the set is prefix-closed, the cached blocks of ``hashes`` are exactly its
        first ``prefix_hits`` ones and the rest are absent; both parts are then handled by
        C-level bulk calls (the absent tail inserted last-block-first, then the cached head
        refreshed last-block-first), with no per-block Python loop.
        """
        if self.capacity == 0 or not hashes:
            return
        d = self._d
        k = self.prefix_hits(hashes)
        if k < len(hashes):
            d.update(dict.fromkeys(reversed(hashes[k:])))
        if k:
            deque(map(d.move_to_end, reversed(hashes[:k])), maxlen=0)
        excess = len(d) - self.capacity
        if excess > 0:
            self.evictions += excess
            deque(map(d.popitem, repeat(False, excess)), maxlen=0)
