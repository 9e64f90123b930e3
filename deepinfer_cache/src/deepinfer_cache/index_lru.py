"""Per-tier LRU order of ``PrefixIndex``: doubly linked lists threaded through the node ids.

Each tier keeps its resident nodes in a list (head = least recently used) through the
``_lru_prev`` / ``_lru_next`` columns. A touch walks a path deepest-first, so ancestors stay
more recent than their descendants and eviction takes leaves; a path touched before usually
still lies in the list as a few stretches, each moved with one splice.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from itertools import compress

from .index_columns import _NONE, IndexColumns


class TierLruLists(IndexColumns):
    """Moves ids within, into and out of each tier's LRU list."""

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
