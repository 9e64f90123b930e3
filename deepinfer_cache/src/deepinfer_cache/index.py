"""``PrefixIndex``: a radix tree over chained block hashes with per-tier LRU, pins and TTLs.

Each node is one cached block. Because block hashes are chained, a hash names its whole prefix,
so the tree is kept as parent/children links plus one dict from hash to node: ``match`` walks
the hashes of a prompt and stops at the first block that is absent or expired.

Invariants the store relies on:

* A node exists while it is resident in at least one tier (a bit in ``tiers``).
* Pins are taken on matched prefixes, so an ancestor is pinned at least as often as any of its
  descendants; pinned nodes are never evicted, dropped or expired.
* Within a tier, eviction takes the least recently used unpinned node that has no child resident
  in that tier (a leaf of that tier); where a victim cannot be demoted, a last copy must have
  no children at all, so an eviction never drops blocks cached elsewhere. Touches walk deepest-first, so ancestors stay
  more recent than their descendants.
* Dropping a node (last tier gone, or expiry) drops its subtree, which is unreachable otherwise.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from .clock import Clock, SystemClock
from .retention import RetentionPolicy


class _Node:
    __slots__ = ("children", "expires", "key", "parent", "pins", "retention", "stamp", "tiers")

    def __init__(self, key: bytes, parent: _Node | None, expires: float, retention: str) -> None:
        self.key = key
        self.parent = parent
        self.children: dict[bytes, _Node] | None = None
        self.tiers = 0
        self.pins = 0
        self.expires = expires
        self.stamp = expires  # the expiry last reported as persisted (see ``refresh``)
        self.retention = retention


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
        self._nodes: dict[bytes, _Node] = {}
        self._lru: list[OrderedDict[bytes, _Node]] = [OrderedDict() for _ in range(num_tiers)]
        # The LRU lists of each tier bitmask, precomputed so a touch does no bit arithmetic.
        self._lru_by_mask = [
            tuple(self._lru[i] for i in range(num_tiers) if mask >> i & 1)
            for mask in range(1 << num_tiers)
        ]

    # ------------------------------------------------------------------ queries
    def __len__(self) -> int:
        return len(self._nodes)

    def __contains__(self, key: object) -> bool:
        return key in self._nodes

    def keys_parents_first(self) -> list[bytes]:
        """All blocks, every parent before its children (creation order)."""
        return list(self._nodes)

    def tiers_of(self, key: bytes) -> int:
        """Tier bitmask of ``key`` (0 when absent)."""
        node = self._nodes.get(key)
        return node.tiers if node is not None else 0

    def pins_of(self, key: bytes) -> int:
        node = self._nodes.get(key)
        return node.pins if node is not None else 0

    def expires_of(self, key: bytes) -> float | None:
        node = self._nodes.get(key)
        return node.expires if node is not None else None

    def retention_of(self, key: bytes) -> str | None:
        node = self._nodes.get(key)
        return node.retention if node is not None else None

    def parent_of(self, key: bytes) -> bytes | None:
        node = self._nodes[key]
        return node.parent.key if node.parent is not None else None

    def count_in(self, tier: int) -> int:
        """Number of blocks resident in ``tier``."""
        return len(self._lru[self._check_tier(tier)])

    def keys_in(self, tier: int) -> list[bytes]:
        """Blocks resident in ``tier``, least recently used first."""
        return list(self._lru[self._check_tier(tier)])

    def match(self, hashes: Sequence[bytes], *, touch: bool = True) -> MatchResult:
        """Count the leading ``hashes`` that are cached and unexpired; touch them if asked."""
        nodes = self._nodes
        now = self.clock.now()
        matched: list[_Node] = []
        for h in hashes:
            node = nodes.get(h)
            if node is None or node.expires <= now:
                break
            matched.append(node)
        if touch and matched:
            self._touch(matched)
        return MatchResult(len(matched), tuple(n.tiers for n in matched))

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
        bit = 1 << self._check_tier(tier)
        expires = self.clock.now() + self.retention.ttl(retention)
        prev: _Node | None = None
        if parent is not None:
            prev = self._nodes.get(parent)
            if prev is None:
                raise ValueError("parent must be a block already in the index")
        created = 0
        path: list[_Node] = []
        lru = self._lru[tier]
        for h in hashes:
            if not isinstance(h, bytes):
                raise TypeError(f"hashes must be bytes, got {type(h).__name__}")
            node = self._nodes.get(h)
            if node is None:
                node = _Node(h, prev, expires, retention)
                self._nodes[h] = node
                if prev is not None:
                    if prev.children is None:
                        prev.children = {}
                    prev.children[h] = node
                created += 1
            elif node.parent is not prev:
                raise ValueError("hashes do not form a chain under the given parent")
            else:
                self._refresh(node, expires, retention)
            if not node.tiers & bit:
                node.tiers |= bit
                lru[h] = node
            path.append(node)
            prev = node
        if not touch:
            return created
        ancestors: list[_Node] = []
        anc = path[0].parent if path else prev
        while anc is not None:
            self._refresh(anc, expires, retention)
            ancestors.append(anc)
            anc = anc.parent
        ancestors.reverse()
        self._touch(ancestors + path)
        return created

    def refresh(self, hashes: Sequence[bytes], retention: str = "chat") -> list[bytes]:
        """Extend the TTL of present ``hashes`` to now + ttl(retention) and touch them.

        Returns the blocks whose expiry moved ``persist_granularity`` seconds or more past the
        value last returned here, so a durable tier can persist the new expiry sparingly."""
        expires = self.clock.now() + self.retention.ttl(retention)
        nodes = [n for n in (self._nodes.get(h) for h in hashes) if n is not None]
        moved: list[bytes] = []
        for node in nodes:
            self._refresh(node, expires, retention)
            if node.expires - node.stamp >= self.persist_granularity:
                node.stamp = node.expires
                moved.append(node.key)
        self._touch(nodes)
        return moved

    def restore(
        self, key: bytes, parent: bytes | None, tier: int, retention: str, expires_at: float
    ) -> None:
        """Re-add a block recovered from a durable tier (parents first, no touch)."""
        bit = 1 << self._check_tier(tier)
        node = self._nodes.get(key)
        if node is None:
            prev = None
            if parent is not None:
                prev = self._nodes.get(parent)
                if prev is None:
                    raise ValueError("parent must be restored before its children")
            node = _Node(key, prev, expires_at, retention)
            self._nodes[key] = node
            if prev is not None:
                if prev.children is None:
                    prev.children = {}
                prev.children[key] = node
        else:
            self._refresh(node, expires_at, retention)
        if not node.tiers & bit:
            node.tiers |= bit
            self._lru[tier][key] = node

    def reorder_lru(self, tier: int, keys_oldest_first: Iterable[bytes]) -> None:
        """Move ``keys`` to the MRU end of ``tier``'s LRU in the given order (after restore)."""
        lru = self._lru[self._check_tier(tier)]
        for k in keys_oldest_first:
            if k in lru:
                lru.move_to_end(k)

    def add_tier(self, key: bytes, tier: int) -> None:
        """Mark an existing block resident in ``tier`` too (promotion / demotion target)."""
        bit = 1 << self._check_tier(tier)
        node = self._nodes[key]
        if not node.tiers & bit:
            node.tiers |= bit
            self._lru[tier][key] = node

    def remove_tier(self, key: bytes, tier: int) -> list[Dropped]:
        """Forget ``key``'s copy in ``tier``. If no copy is left the node and its subtree are
        dropped; returns the dropped blocks (other tiers' data of those must be freed)."""
        bit = 1 << self._check_tier(tier)
        node = self._nodes.get(key)
        if node is None or not node.tiers & bit:
            return []
        node.tiers &= ~bit
        del self._lru[tier][key]
        if node.tiers:
            return []
        return self._drop(node)

    def pick_victim(
        self, tier: int, exclude: Iterable[bytes] = (), *, keep_inner_last_copies: bool = True
    ) -> bytes | None:
        """The LRU unpinned block of ``tier`` with no child in ``tier``; None if there is none.

        With ``keep_inner_last_copies`` (for a tier whose victims have nowhere to go) a block
        held only in ``tier`` must also have no children at all, since dropping it would drop
        descendants cached in other tiers."""
        bit = 1 << self._check_tier(tier)
        skip = exclude if isinstance(exclude, set | frozenset) else set(exclude)
        for key, node in self._lru[tier].items():
            if node.pins or key in skip:
                continue
            if node.children:
                if any(c.tiers & bit for c in node.children.values()):
                    continue
                if keep_inner_last_copies and node.tiers == bit:
                    continue
            return key
        return None

    def has_children(self, key: bytes) -> bool:
        node = self._nodes.get(key)
        return bool(node is not None and node.children)

    def pin(self, hashes: Sequence[bytes]) -> int:
        """Pin the matched (present, unexpired) prefix of ``hashes``; returns how many."""
        m = self.match(hashes, touch=False)
        for h in hashes[: m.num_blocks]:
            self._nodes[h].pins += 1
        return m.num_blocks

    def unpin(self, hashes: Sequence[bytes]) -> None:
        """Release one pin on each of ``hashes``. Blocks already force-dropped (corrupt) are
        skipped; a present block that is not pinned raises ``ValueError``."""
        nodes = [self._nodes.get(h) for h in hashes]
        for node in nodes:
            if node is not None and node.pins <= 0:
                raise ValueError("unpin of a block that is not pinned")
        for node in nodes:
            if node is not None:
                node.pins -= 1

    def expire(self, now: float | None = None) -> list[Dropped]:
        """Drop every unpinned block whose TTL has passed (with its subtree)."""
        t = self.clock.now() if now is None else now
        dropped: list[Dropped] = []
        for node in [n for n in self._nodes.values() if n.expires <= t and n.pins == 0]:
            if node.key in self._nodes:
                dropped.extend(self._drop(node))
        return dropped

    def drop(self, key: bytes) -> list[Dropped]:
        """Drop ``key`` and its subtree whatever its tiers and pins (a corrupt block)."""
        node = self._nodes.get(key)
        return self._drop(node, force=True) if node is not None else []

    # ------------------------------------------------------------------ internals
    def _check_tier(self, tier: int) -> int:
        if isinstance(tier, bool) or not isinstance(tier, int) or not 0 <= tier < self.num_tiers:
            raise ValueError(f"tier must be an int in [0, {self.num_tiers}), got {tier!r}")
        return tier

    @staticmethod
    def _refresh(node: _Node, expires: float, retention: str) -> None:
        if expires > node.expires:
            node.expires = expires
            node.retention = retention

    def _touch(self, path: list[_Node]) -> None:
        # Deepest first: ancestors end up more recent than descendants, so LRU takes leaves.
        by_mask = self._lru_by_mask
        for node in reversed(path):
            for lru in by_mask[node.tiers]:
                lru.move_to_end(node.key)

    def _drop(self, node: _Node, force: bool = False) -> list[Dropped]:
        if node.pins and not force:
            raise ValueError("cannot drop a pinned block")
        out: list[Dropped] = []
        stack = [node]
        while stack:
            n = stack.pop()
            if n.children:
                stack.extend(n.children.values())
            out.append(Dropped(n.key, n.tiers))
            t, i = n.tiers, 0
            while t:
                if t & 1:
                    self._lru[i].pop(n.key, None)
                t >>= 1
                i += 1
            self._nodes.pop(n.key, None)
        if node.parent is not None and node.parent.children is not None:
            node.parent.children.pop(node.key, None)
            if not node.parent.children:
                node.parent.children = None
        return out
