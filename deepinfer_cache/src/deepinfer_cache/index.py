"""``PrefixIndex``: a radix tree over chained block hashes with per-tier LRU, pins and TTLs.

Each node is one cached block. Because block hashes are chained, a hash names its whole prefix,
so the tree is kept as parent/child links plus one dict from hash to node: ``match`` walks the
hashes of a prompt and stops at the first block that is absent or expired.

Layout: a node is a small integer id into flat columns (``array``s of parents, sibling links,
tier masks, pins, expiry times, per-tier LRU links; keys in one ``bytearray``), found through
one ``dict`` from hash to id. None of these is a container the cyclic garbage collector visits
(a dict holding only bytes and ints is untracked; arrays hold no objects), so a full collection
costs the same with a million blocks indexed as with none.

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

from array import array
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import compress
from typing import cast

import numpy as np

from .clock import Clock, SystemClock
from .index_walk import gather, leading_chain_ids
from .retention import RetentionPolicy

_NONE = -1
_KEY = 16  # bytes per block hash
EXPIRY_BUCKET = 60.0


@dataclass(frozen=True)
class MatchResult:
    """``num_blocks`` leading blocks are cached; ``tiers[i]`` is block i's tier bitmask."""

    num_blocks: int
    tiers: tuple[int, ...]

    def blocks_in(self, tier: int) -> int:
        """How many matched blocks are resident in ``tier``."""
        bit = 1 << tier
        return sum(1 for m in self.tiers if m & bit)


@dataclass(frozen=True)
class Dropped:
    """A block removed from the index; ``tiers`` is the bitmask whose data must be freed."""

    key: bytes
    tiers: int


class PrefixIndex:
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

    def expire(self, now: float | None = None, *, limit: int | None = None) -> list[Dropped]:
        """Drop unpinned blocks whose TTL has passed (with their subtrees). With ``limit``,
        stop after about that many blocks (call again for more): work is proportional to what
        expires, never a scan of the whole index."""
        t = self.clock.now() if now is None else now
        cur = int(t // EXPIRY_BUCKET)
        dropped: list[Dropped] = []
        expires, alive, pins, bucket_of = self._expires, self._alive, self._pins, self._bucket_of
        for b in sorted(k for k in self._buckets if k <= cur):
            entries = self._buckets.pop(b)
            keep = array("q")
            for j, i in enumerate(entries):
                if limit is not None and len(dropped) >= limit:
                    keep.extend(entries[j:])
                    break
                if not alive[i] or bucket_of[i] != b:
                    continue  # dropped, or filed under a later bucket since
                exp = expires[i]
                if exp <= t:
                    if pins[i]:
                        keep.append(i)  # in use: retried on a later call
                    else:
                        dropped.extend(self._drop(i))
                elif int(exp // EXPIRY_BUCKET) == b:
                    keep.append(i)
                else:
                    self._file_expiry(i, exp)  # refreshed: move to its current bucket
            if keep:
                self._buckets.setdefault(b, array("q")).extend(keep)
            if limit is not None and len(dropped) >= limit:
                break
        return dropped

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

    # ------------------------------------------------------------------ internals
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

    def _new_node(self, key: bytes, parent: int, expires: float, retention: str) -> int:
        if len(key) != _KEY:
            raise ValueError(f"block hashes must be {_KEY} bytes, got {len(key)}")
        cls = self._class(retention)
        if self._free_ids:
            i = self._free_ids.pop()
            self._keys[_KEY * i : _KEY * i + _KEY] = key
            self._alive[i] = 1
            self._parent[i] = parent
            self._first_child[i] = _NONE
            self._next_sib[i] = _NONE
            self._prev_sib[i] = _NONE
            self._nchildren[i] = 0
            for ci in self._child_in:
                ci[i] = 0
            self._tiers[i] = 0
            self._pins[i] = 0
            self._expires[i] = expires
            self._stamp[i] = expires
            self._ret[i] = cls
        else:
            i = len(self._alive)
            self._keys += key
            self._alive.append(1)
            self._parent.append(parent)
            self._first_child.append(_NONE)
            self._next_sib.append(_NONE)
            self._prev_sib.append(_NONE)
            self._nchildren.append(0)
            for ci in self._child_in:
                ci.append(0)
            self._tiers.append(0)
            self._pins.append(0)
            self._expires.append(expires)
            self._stamp.append(expires)
            self._ret.append(cls)
            self._bucket_of.append(_NONE)
            for t in range(self.num_tiers):
                self._lru_prev[t].append(_NONE)
                self._lru_next[t].append(_NONE)
        self._ids[key] = i
        if parent != _NONE:
            head = self._first_child[parent]
            self._next_sib[i] = head
            if head != _NONE:
                self._prev_sib[head] = i
            self._first_child[parent] = i
            self._nchildren[parent] += 1
        self._file_expiry(i, expires)
        return i

    def _file_expiry(self, i: int, expires: float) -> None:
        b = int(expires // EXPIRY_BUCKET)
        self._bucket_of[i] = b
        entries = self._buckets.get(b)
        if entries is None:
            self._buckets[b] = array("q", (i,))
        else:
            entries.append(i)

    # ------------------------------------------------------------------ LRU lists
    def _lru_ids(self, t: int) -> Iterator[int]:
        nxt = self._lru_next[t]
        i = self._head[t]
        while i != _NONE:
            n = nxt[i]  # read first: the caller may unlink i meanwhile
            yield i
            i = n

    def _lru_append(self, t: int, i: int) -> None:
        last = self._tail[t]
        self._lru_prev[t][i] = last
        self._lru_next[t][i] = _NONE
        if last != _NONE:
            self._lru_next[t][last] = i
        else:
            self._head[t] = i
        self._tail[t] = i
        self._count[t] += 1

    def _lru_remove(self, t: int, i: int) -> None:
        prev, nxt = self._lru_prev[t], self._lru_next[t]
        p, n = prev[i], nxt[i]
        if p != _NONE:
            nxt[p] = n
        else:
            self._head[t] = n
        if n != _NONE:
            prev[n] = p
        else:
            self._tail[t] = p
        self._count[t] -= 1

    def _lru_move_to_end(self, t: int, i: int) -> None:
        last = self._tail[t]
        if last == i:
            return
        prev, nxt = self._lru_prev[t], self._lru_next[t]
        p, n = prev[i], nxt[i]
        if p != _NONE:
            nxt[p] = n
        else:
            self._head[t] = n
        prev[n] = p  # i is not the tail, so n exists
        prev[i] = last
        nxt[i] = _NONE
        nxt[last] = i
        self._tail[t] = i

    def _extend(self, i: int, expires: float, retention: str) -> None:
        if expires > self._expires[i]:
            self._expires[i] = expires
            self._ret[i] = self._class(retention)

    def _set_tier(self, i: int, tier: int) -> None:
        bit = 1 << tier
        if not self._tiers[i] & bit:
            self._tiers[i] |= bit
            self._lru_append(tier, i)
            p = self._parent[i]
            if p != _NONE:
                self._child_in[tier][p] += 1

    def _clear_tier(self, i: int, tier: int) -> None:
        self._tiers[i] &= ~(1 << tier)
        self._lru_remove(tier, i)
        p = self._parent[i]
        if p != _NONE:
            self._child_in[tier][p] -= 1

    def _touch(self, path: list[int], masks: Sequence[int] | None = None) -> None:
        # Deepest first: ancestors end up more recent than descendants, so LRU takes leaves.
        # ``masks`` are the path's tier bitmasks when the caller has them already.
        packed = bytes(masks) if masks is not None else bytes(map(self._tiers.__getitem__, path))
        distinct = set(packed)  # usually one or two masks along a prompt
        present = 0
        for mask in distinct:
            present |= mask
        for t in range(self.num_tiers):
            bit = 1 << t
            if not self._count[t] or not present & bit:
                continue
            if all(mask & bit for mask in distinct):
                mine = path
            else:  # the blocks resident in t, picked in C (translate maps masks to 0/1)
                mine = list(compress(path, packed.translate(self._in_tier[t])))
            self._move_to_tail(t, mine)

    def _move_to_tail(self, t: int, path: Sequence[int]) -> None:
        """Make ``reversed(path)`` the most recent end of tier ``t``'s LRU list, the others
        keeping their order. A path touched before usually still lies in the list as one
        stretch (or a few), in reverse order: each stretch moves with one splice, so a repeat
        lookup of a long prompt costs a C-level comparison, not a Python step per block."""
        nxt = self._lru_next[t]
        n = len(path)
        succ = list(map(nxt.__getitem__, path))  # what follows each node in the list now
        # A stretch breaks where path[k] is not directly followed by path[k - 1].
        if succ[1:] == path[: n - 1]:
            starts = [0]
        elif len(set(path)) != n:  # a repeated id: stretches are ill-defined, go one by one
            self._move_each_to_tail(t, path)
            return
        else:
            starts = [0] + [k for k in range(1, n) if succ[k] != path[k - 1]]
        prev = self._lru_prev[t]
        head, tail = self._head[t], self._tail[t]
        end = n
        for s in reversed(starts):  # deepest stretch first
            first, last = path[end - 1], path[s]  # oldest and newest node of the stretch
            end = s
            if last == tail:
                continue  # already the most recent end
            p, q = prev[first], nxt[last]  # q exists: ``last`` is not the tail
            if p != _NONE:
                nxt[p] = q
            else:
                head = q
            prev[q] = p
            nxt[tail] = first
            prev[first] = tail
            nxt[last] = _NONE
            tail = last
        self._head[t], self._tail[t] = head, tail

    def _move_each_to_tail(self, t: int, path: Sequence[int]) -> None:
        """``_move_to_tail`` one node at a time (the plain definition)."""
        for i in reversed(path):
            self._lru_move_to_end(t, i)

    def _drop(self, i: int, force: bool = False) -> list[Dropped]:
        if self._pins[i] and not force:
            raise ValueError("cannot drop a pinned block")
        # Unlink the subtree root from its parent, then free every node below it.
        p = self._parent[i]
        if p != _NONE:
            for t in range(self.num_tiers):
                if self._tiers[i] >> t & 1:
                    self._child_in[t][p] -= 1
            prev, nxt = self._prev_sib[i], self._next_sib[i]
            if prev != _NONE:
                self._next_sib[prev] = nxt
            else:
                self._first_child[p] = nxt
            if nxt != _NONE:
                self._prev_sib[nxt] = prev
            self._nchildren[p] -= 1
        out: list[Dropped] = []
        stack = [i]
        while stack:
            n = stack.pop()
            c = self._first_child[n]
            while c != _NONE:
                stack.append(c)
                c = self._next_sib[c]
            key = self._key(n)
            mask = self._tiers[n]
            out.append(Dropped(key, mask))
            for t in self._bits[mask]:
                self._lru_remove(t, n)
            del self._ids[key]
            self._alive[n] = 0
            self._tiers[n] = 0
            self._free_ids.append(n)
        return out
