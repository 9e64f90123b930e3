"""``PrefixIndex``: a radix tree over chained block hashes with per-tier LRU, pins and TTLs.

Each node is one cached block. Because block hashes are chained, a hash names its whole prefix,
so the tree is kept as parent/child links plus one dict from hash to node: ``match`` walks the
hashes of a prompt and stops at the first block that is absent or expired.

The code is layered, one concept per module: ``index_columns.py`` (the flat storage),
``index_lru.py`` (per-tier LRU lists), ``index_nodes.py`` (node lifecycle and expiry),
``index_walk.py`` (finding a chain's leading blocks), ``index_records.py`` (``MatchResult``,
``Dropped``); this module is the public ``PrefixIndex``.

Invariants the store relies on:

* A node exists while it is resident in at least one tier (a bit in its tier mask).
* Pins are taken on matched prefixes, so an ancestor is pinned at least as often as any of its
  descendants; pinned nodes are never evicted, dropped or expired.
* Within a tier, eviction takes the least recently used unpinned node that has no child resident
  in that tier (a leaf of that tier); where a victim cannot be demoted, a last copy must have no
  children at all, so an eviction never drops blocks cached elsewhere. Touches walk
  deepest-first, so ancestors stay more recent than their descendants.
* Dropping a node (last tier gone, or expiry) drops its subtree, which is unreachable otherwise.
* Expiry is incremental: ids sit in time buckets (``EXPIRY_BUCKET`` seconds wide) checked
  lazily against the node's current expiry, so ``expire(limit=...)`` does work proportional to
  what it drops (plus one pass over the bucket ids), never a scan of every block.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import cast

import numpy as np

from .clock import Clock, SystemClock
from .index_columns import _NONE
from .index_nodes import EXPIRY_BUCKET, IndexNodes
from .index_records import Dropped, MatchResult
from .index_walk import gather, leading_chain_ids
from .retention import RetentionPolicy

__all__ = ["EXPIRY_BUCKET", "Dropped", "MatchResult", "PrefixIndex"]


class PrefixIndex(IndexNodes):
    """Radix tree over block hashes (see the module docstring).

    >>> from deepinfer_cache.hashing import hash_token_blocks
    >>> idx = PrefixIndex(num_tiers=2)
    >>> hs = hash_token_blocks(range(8), 4)
    >>> idx.insert(hs, tier=1)
    2
    >>> idx.match(hs).num_blocks
    2
    """

    def __init__(
        self,
        num_tiers: int = 3,
        retention: RetentionPolicy | None = None,
        clock: Clock | None = None,
        persist_granularity: float = 3600.0,
    ) -> None:
        if isinstance(num_tiers, bool) or not isinstance(num_tiers, int) or not 1 <= num_tiers <= 8:
            raise ValueError(f"num_tiers must be an int in [1, 8], got {num_tiers!r}")
        self.num_tiers = num_tiers
        self.retention = retention if retention is not None else RetentionPolicy()
        self.clock: Clock = clock if clock is not None else SystemClock()
        self.persist_granularity = float(persist_granularity)
        self._reset()

    # ------------------------------------------------------------------ queries
    def __len__(self) -> int:
        return len(self._ids)

    def __contains__(self, key: object) -> bool:
        return key in self._ids

    def keys_parents_first(self) -> list[bytes]:
        """All blocks, every parent before its children (creation order)."""
        return list(self._ids)

    def tiers_of(self, key: bytes) -> int:
        """Tier bitmask of ``key`` (0 when absent)."""
        i = self._ids.get(key)
        return self._tiers[i] if i is not None else 0

    def pins_of(self, key: bytes) -> int:
        i = self._ids.get(key)
        return self._pins[i] if i is not None else 0

    def expires_of(self, key: bytes) -> float | None:
        i = self._ids.get(key)
        return self._expires[i] if i is not None else None

    def retention_of(self, key: bytes) -> str | None:
        i = self._ids.get(key)
        return self._classes[self._ret[i]] if i is not None else None

    def parent_of(self, key: bytes) -> bytes | None:
        p = self._parent[self._ids[key]]
        return self._key(p) if p != _NONE else None

    def count_in(self, tier: int) -> int:
        """Number of blocks resident in ``tier``."""
        return self._count[self._check_tier(tier)]

    def keys_in(self, tier: int) -> list[bytes]:
        """Blocks resident in ``tier``, least recently used first."""
        return [self._key(i) for i in self._lru_ids(self._check_tier(tier))]

    def children_of(self, key: bytes) -> list[bytes]:
        out: list[bytes] = []
        c = self._first_child[self._ids[key]]
        while c != _NONE:
            out.append(self._key(c))
            c = self._next_sib[c]
        return out

    def match(self, hashes: Iterable[bytes], *, touch: bool = True) -> MatchResult:
        """Count the leading ``hashes`` that are cached and unexpired; touch them if asked.
        ``hashes`` may be a lazy iterator: it is consumed only up to the first miss."""
        now = self.clock.now()
        if isinstance(hashes, list | tuple):
            matched, masks = self._leading(hashes, now)
            if touch and matched:
                self._touch(matched, masks)
            return MatchResult(len(matched), masks)
        ids = self._ids
        expires = self._expires
        matched = []
        for h in hashes:
            i = ids.get(h)
            if i is None or expires[i] <= now:
                break
            matched.append(i)
        masks = tuple(map(self._tiers.__getitem__, matched))
        if touch and matched:
            self._touch(matched, masks)
        return MatchResult(len(matched), masks)

    def _leading(self, hashes: Sequence[bytes], now: float) -> tuple[list[int], tuple[int, ...]]:
        """Ids and tier masks of the leading present, unexpired ``hashes``: found by a binary
        search and the parent links when ``hashes`` is one chain (``index_walk.py``), read
        with vectorised gathers; else by probing each block."""
        walked = leading_chain_ids(self._ids, self._keys, self._parent, hashes)
        if walked is None:
            found = self._leading_ids(hashes, now)
            return found, tuple(map(self._tiers.__getitem__, found))
        found, at = walked
        if not found:
            return [], ()
        expired = np.flatnonzero(gather(self._expires, at, np.float64) <= now)
        if expired.size:
            k = int(expired[0])
            del found[k:]
            at = at[:k]
        return found, tuple(gather(self._tiers, at, np.uint8).tobytes())

    def _leading_ids(self, hashes: Sequence[bytes], now: float) -> list[int]:
        """Ids of the leading present, unexpired ``hashes``. The probes and the expiry reads
        run as C loops (``map``) instead of a Python iteration per block; on a 1M-block index
        the dict probes' cache misses are most of what is left."""
        probed = list(map(self._ids.get, hashes))
        if None in probed:
            del probed[probed.index(None) :]
        found = cast(list[int], probed)  # the Nones were cut off above
        if found and min(map(self._expires.__getitem__, found)) <= now:
            expires = self._expires
            for k, i in enumerate(found):
                if expires[i] <= now:
                    del found[k:]
                    break
        return found

    # ------------------------------------------------------------------ updates
    def insert(
        self,
        hashes: Sequence[bytes],
        tier: int,
        retention: str = "chat",
        parent: bytes | None = None,
        *,
        touch: bool = True,
    ) -> int:
        """Mark the chain ``hashes`` (children of ``parent``; None = the root) resident in
        ``tier``, refresh their TTL and touch the whole path from the root. Returns how many
        nodes are new. ``touch=False`` skips the walk over the ancestors (the caller refreshes
        the whole chain once afterwards, e.g. when adding one block at a time)."""
        self._check_tier(tier)
        expires = self.clock.now() + self.retention.ttl(retention)
        prev = _NONE
        if parent is not None:
            p = self._ids.get(parent)
            if p is None:
                raise ValueError("parent must be a block already in the index")
            prev = p
        created = 0
        path: list[int] = []
        for h in hashes:
            if not isinstance(h, bytes):
                raise TypeError(f"hashes must be bytes, got {type(h).__name__}")
            i = self._ids.get(h)
            if i is None:
                i = self._new_node(h, prev, expires, retention)
                created += 1
            elif self._parent[i] != prev:
                raise ValueError("hashes do not form a chain under the given parent")
            else:
                self._extend(i, expires, retention)
            self._set_tier(i, tier)
            path.append(i)
            prev = i
        if not touch:
            return created
        ancestors: list[int] = []
        anc = self._parent[path[0]] if path else prev
        while anc != _NONE:
            self._extend(anc, expires, retention)
            ancestors.append(anc)
            anc = self._parent[anc]
        ancestors.reverse()
        self._touch(ancestors + path)
        return created

    def refresh(self, hashes: Sequence[bytes], retention: str | None = "chat") -> list[bytes]:
        """Extend the TTL of present ``hashes`` to now + ttl(retention) and touch them
        (``retention=None``: each block's own class; blocks of a class the policy does not
        know keep their expiry).

        Returns the blocks whose expiry moved ``persist_granularity`` seconds or more past the
        value last returned here, so a durable tier can persist the new expiry sparingly."""
        now = self.clock.now()
        fixed = None if retention is None else now + self.retention.ttl(retention)
        ids = [i for i in (self._ids.get(h) for h in hashes) if i is not None]
        ttls = self.retention.ttls
        moved: list[bytes] = []
        for i in ids:
            if fixed is not None and retention is not None:
                self._extend(i, fixed, retention)
            else:
                cls = self._classes[self._ret[i]]
                ttl = ttls.get(cls)
                if ttl is None:
                    continue
                self._extend(i, now + float(ttl), cls)
            if self._expires[i] - self._stamp[i] >= self.persist_granularity:
                self._stamp[i] = self._expires[i]
                moved.append(self._key(i))
        self._touch(ids)
        return moved

    def restore(
        self, key: bytes, parent: bytes | None, tier: int, retention: str, expires_at: float
    ) -> None:
        """Re-add a block recovered from a durable tier (parents first, no touch). The
        retention class may be one the policy does not know (kept until ``expires_at``)."""
        self._check_tier(tier)
        i = self._ids.get(key)
        if i is None:
            prev = _NONE
            if parent is not None:
                p = self._ids.get(parent)
                if p is None:
                    raise ValueError("parent must be restored before its children")
                prev = p
            i = self._new_node(key, prev, expires_at, retention)
        else:
            self._extend(i, expires_at, retention)
        self._set_tier(i, tier)

    def reorder_lru(self, tier: int, keys_oldest_first: Iterable[bytes]) -> None:
        """Move ``keys`` to the MRU end of ``tier``'s LRU in the given order (after restore)."""
        t = self._check_tier(tier)
        ids = self._ids
        for k in keys_oldest_first:
            i = ids.get(k)
            if i is not None and self._tiers[i] >> t & 1:
                self._lru_move_to_end(t, i)

    def add_tier(self, key: bytes, tier: int) -> None:
        """Mark an existing block resident in ``tier`` too (promotion / demotion target)."""
        self._set_tier(self._ids[key], self._check_tier(tier))

    def remove_tier(self, key: bytes, tier: int) -> list[Dropped]:
        """Forget ``key``'s copy in ``tier``. If no copy is left the node and its subtree are
        dropped; returns the dropped blocks (other tiers' data of those must be freed)."""
        bit = 1 << self._check_tier(tier)
        i = self._ids.get(key)
        if i is None or not self._tiers[i] & bit:
            return []
        self._clear_tier(i, tier)
        if self._tiers[i]:
            return []
        return self._drop(i)

    def pick_victim(
        self, tier: int, exclude: Iterable[bytes] = (), *, keep_inner_last_copies: bool = True
    ) -> bytes | None:
        """The LRU unpinned block of ``tier`` with no child in ``tier``; None if there is none.

        With ``keep_inner_last_copies`` (for a tier whose victims have nowhere to go) a block
        held only in ``tier`` must also have no children at all, since dropping it would drop
        descendants cached in other tiers."""
        bit = 1 << self._check_tier(tier)
        skip = exclude if isinstance(exclude, set | frozenset) else set(exclude)
        pins, nchildren, child_in, tiers = (
            self._pins,
            self._nchildren,
            self._child_in[tier],
            self._tiers,
        )
        for i in self._lru_ids(tier):
            if pins[i]:
                continue
            key = self._key(i)
            if key in skip:
                continue
            if nchildren[i]:
                if child_in[i]:
                    continue
                if keep_inner_last_copies and tiers[i] == bit:
                    continue
            return key
        return None

    def has_children(self, key: bytes) -> bool:
        i = self._ids.get(key)
        return bool(i is not None and self._nchildren[i])

    def pin(self, hashes: Sequence[bytes]) -> int:
        """Pin the matched (present, unexpired) prefix of ``hashes``; returns how many."""
        m = self.match(hashes, touch=False)
        for h in hashes[: m.num_blocks]:
            self._pins[self._ids[h]] += 1
        return m.num_blocks

    def unpin(self, hashes: Sequence[bytes]) -> None:
        """Release one pin on each of ``hashes``. Blocks already force-dropped (corrupt) are
        skipped; a present block that is not pinned raises ``ValueError``."""
        ids = [self._ids.get(h) for h in hashes]
        for i in ids:
            if i is not None and self._pins[i] <= 0:
                raise ValueError("unpin of a block that is not pinned")
        for i in ids:
            if i is not None:
                self._pins[i] -= 1

    def drop(self, key: bytes) -> list[Dropped]:
        """Drop ``key`` and its subtree whatever its tiers and pins (a corrupt block)."""
        i = self._ids.get(key)
        return self._drop(i, force=True) if i is not None else []

    def drop_unpinned(self, key: bytes) -> list[Dropped]:
        """Drop ``key``'s subtree except blocks in use (pinned) and, necessarily, their
        ancestors; returns what was dropped. Pinned blocks form the top of a subtree (a pin
        covers the whole prefix), so every unpinned node found below them goes with its
        subtree."""
        i = self._ids.get(key)
        if i is None:
            return []
        out: list[Dropped] = []
        stack = [i]
        while stack:
            n = stack.pop()
            if not self._pins[n]:
                out.extend(self._drop(n))
                continue
            c = self._first_child[n]
            while c != _NONE:
                nxt = self._next_sib[c]  # read first: dropping c unlinks it
                stack.append(c)
                c = nxt
        return out

    def roots(self) -> list[bytes]:
        """The first blocks of every chain."""
        parent = self._parent
        return [k for k, i in self._ids.items() if parent[i] == _NONE]

    def clear(self) -> list[Dropped]:
        """Drop every block (pins included); returns them all."""
        out = [Dropped(k, self._tiers[i]) for k, i in self._ids.items()]
        self._reset()
        return out
