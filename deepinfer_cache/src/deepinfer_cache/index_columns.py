"""The storage layout of ``PrefixIndex``: flat columns indexed by a node id.

A node is a small integer id into flat columns (``array``s of parents, sibling links, tier
masks, pins, expiry times, per-tier LRU links; keys in one ``bytearray``), found through one
``dict`` from hash to id. None of these is a container the cyclic garbage collector visits (a
dict holding only bytes and ints is untracked; arrays hold no objects), so a full collection
costs the same with a million blocks indexed as with none. ``index_bulk.py`` writes these
columns directly when it loads a whole tier at once.
"""

from __future__ import annotations

from array import array

_NONE = -1
_KEY = 16  # bytes per block hash


class IndexColumns:
    """The columns and the small helpers that read them; the layers above (``index_lru.py``,
    ``index_nodes.py``, ``index.py``) keep them consistent."""

    num_tiers: int  # set by ``PrefixIndex.__init__`` before ``_reset``

    def _reset(self) -> None:
        num_tiers = self.num_tiers
        self._ids: dict[bytes, int] = {}  # insertion order: parents before children
        self._keys = bytearray()  # id i's hash at [16 i, 16 i + 16)
        self._alive = bytearray()
        self._parent = array("q")
        self._first_child = array("q")
        self._next_sib = array("q")
        self._prev_sib = array("q")
        self._nchildren = array("l")
        self._child_in = [array("l") for _ in range(num_tiers)]  # children resident per tier
        self._tiers = bytearray()
        self._pins = array("l")
        self._expires = array("d")
        self._stamp = array("d")  # the expiry last reported as persisted (see ``refresh``)
        self._ret = array("H")  # retention class id into ``_classes``
        self._classes: list[str] = []
        self._class_id: dict[str, int] = {}
        self._free_ids = array("q")
        self._bucket_of = array("q")
        self._buckets: dict[int, array[int]] = {}
        # Per-tier LRU as doubly linked lists through the ids (head = least recently used).
        self._lru_prev = [array("q") for _ in range(num_tiers)]
        self._lru_next = [array("q") for _ in range(num_tiers)]
        self._head = [_NONE] * num_tiers
        self._tail = [_NONE] * num_tiers
        self._count = [0] * num_tiers
        # Per tier, a ``bytes.translate`` table from a bitmask to 1 if it holds the tier.
        self._in_tier = [bytes(mask >> t & 1 for mask in range(256)) for t in range(num_tiers)]
        # The tiers of each bitmask, precomputed so a touch does no bit arithmetic.
        self._bits = [
            tuple(i for i in range(num_tiers) if mask >> i & 1) for mask in range(1 << num_tiers)
        ]

    def _check_tier(self, tier: int) -> int:
        if isinstance(tier, bool) or not isinstance(tier, int) or not 0 <= tier < self.num_tiers:
            raise ValueError(f"tier must be an int in [0, {self.num_tiers}), got {tier!r}")
        return tier

    def _class(self, retention: str) -> int:
        c = self._class_id.get(retention)
        if c is None:
            c = len(self._classes)
            self._classes.append(retention)
            self._class_id[retention] = c
        return c

    def _key(self, i: int) -> bytes:
        return bytes(self._keys[_KEY * i : _KEY * i + _KEY])
