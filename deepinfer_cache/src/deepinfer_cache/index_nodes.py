"""Node lifecycle of ``PrefixIndex``: creation, tier membership, TTL, expiry and drops.

A node exists while it is resident in at least one tier (a bit in its tier mask); dropping a
node drops its subtree, which is unreachable otherwise. Expiry is incremental: ids sit in time
buckets (``EXPIRY_BUCKET`` seconds wide) checked lazily against the node's current expiry, so
``expire(limit=...)`` does work proportional to what it drops (plus one pass over the bucket
ids), never a scan of every block.
"""

from __future__ import annotations

from array import array

from .clock import Clock
from .index_columns import _KEY, _NONE
from .index_lru import TierLruLists
from .index_records import Dropped

EXPIRY_BUCKET = 60.0


class IndexNodes(TierLruLists):
    """Adds and drops nodes, keeping parent/child links, per-tier child counts, LRU lists and
    expiry buckets consistent."""

    clock: Clock  # set by ``PrefixIndex.__init__``

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
