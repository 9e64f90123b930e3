"""The machinery behind ``TieredKVStore``: placement, eviction, demotion, persistence and the
fetch job. ``TieredKVStore`` (``store.py``) is the public face; this class holds its state.

Lock order: store lock -> tier lock. Nothing here waits on the disk while holding the store
lock: a full disk write queue makes ``put`` refuse (counted), and ``_persist`` waits for the
disk with the lock released.
"""

from __future__ import annotations

import logging
import threading
import time
import warnings
from collections import defaultdict
from collections.abc import Sequence
from concurrent.futures import Future
from typing import Any

import torch

from .clock import Clock, SystemClock
from .events import BlockRemoved, EventHub
from .index import Dropped, PrefixIndex
from .io_workers import IOWorkers
from .key_scheme import record_key_scheme
from .meta import BlockMeta
from .recovery import rebuild_index
from .results import FetchResult
from .retention import RetentionPolicy
from .tiers.base import Tier

_POLICIES = ("write-back", "write-through")
_log = logging.getLogger("deepinfer_cache.store")


class StoreCore:
    """State and internals of a tiered store (see ``TieredKVStore``)."""

    tiers: list[Tier]
    persist_on_close: bool
    refresh_on_hit: bool
    key_hash: str
    _fetchers: IOWorkers

    def _init(
        self,
        tiers: Sequence[Tier],
        block_size: int,
        write_policy: str,
        retention: RetentionPolicy | None,
        clock: Clock | None,
        model: bytes,
    ) -> None:
        if not tiers:
            raise ValueError("tiers must name at least one tier")
        if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size <= 0:
            raise ValueError(f"block_size must be a positive int, got {block_size!r}")
        if write_policy not in _POLICIES:
            raise ValueError(f"write_policy must be one of {_POLICIES}, got {write_policy!r}")
        if not isinstance(model, bytes):
            raise TypeError(f"model must be bytes (e.g. name.encode()), got {type(model).__name__}")
        first = tiers[0]
        for t in tiers[1:]:
            if tuple(t.page_shape) != tuple(first.page_shape) or t.dtype != first.dtype:
                raise ValueError("all tiers must share page_shape and dtype")
        self.tiers = list(tiers)
        self.block_size = block_size
        self.write_policy = write_policy
        self.model = model
        self.page_shape = tuple(first.page_shape)
        self.dtype = first.dtype
        self.clock: Clock = clock if clock is not None else SystemClock()
        self.index = PrefixIndex(len(self.tiers), retention, self.clock)
        self._lock = threading.RLock()
        self._c: dict[str, int] = defaultdict(int)
        self._tier_c: list[defaultdict[str, int]] = [defaultdict(int) for _ in self.tiers]
        self._closed = False
        self._events = EventHub()
        self._tenant_of: dict[bytes, bytes] = {}  # first block -> tenant tag
        # Never evicted (nor dropped with an ancestor) while set: the chain being stored.
        self._protect: set[bytes] = set()
        durable = [i for i, t in enumerate(self.tiers) if hasattr(t, "recovered")]
        self._durable = durable[-1] if durable else None

    # ------------------------------------------------------------------ public API
    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("the store is closed")

    def _check_pages(self, pages: Any, n: int) -> Any:
        if isinstance(pages, list | tuple):
            if len(pages) < n:
                raise ValueError(f"pages must hold {n} blocks, got {len(pages)}")
            if any(not isinstance(p, torch.Tensor) for p in pages):
                raise TypeError("pages must be a tensor, a list of tensors or a callable")
            if any(tuple(p.shape) != self.page_shape for p in pages[:n]):
                raise ValueError(f"each page in pages must have shape {self.page_shape}")
            if n == 0:
                return torch.empty(0, *self.page_shape, dtype=self.dtype)
            pages = torch.stack(list(pages[:n]))
        if isinstance(pages, torch.Tensor):
            if pages.dim() != len(self.page_shape) + 1 or pages.shape[0] < n:
                raise ValueError(
                    f"pages must be [{n}, *{self.page_shape}], got {tuple(pages.shape)}"
                )
            self._check_batch(pages[:0], 0, "pages")
            return pages
        if not callable(pages):
            raise TypeError(
                f"pages must be a tensor, a list of tensors or a callable, got {type(pages).__name__}"
            )
        return pages

    def _check_batch(self, data: Any, n: int, name: str) -> None:
        if not isinstance(data, torch.Tensor):
            raise TypeError(f"{name} must return a tensor, got {type(data).__name__}")
        if data.shape[0] != n or tuple(data.shape[1:]) != self.page_shape:
            raise ValueError(f"{name} must give [{n}, *{self.page_shape}], got {tuple(data.shape)}")
        if data.dtype != self.dtype:
            raise TypeError(f"{name} must have dtype {self.dtype}, got {data.dtype}")

    def _fast_device(self) -> torch.device:
        dev = getattr(self.tiers[0], "device", None)
        return torch.device(dev) if dev is not None else torch.device("cpu")

    def _meta(self, key: bytes) -> BlockMeta:
        idx = self.index
        return BlockMeta(
            idx.parent_of(key),
            idx.retention_of(key) or "chat",
            idx.expires_of(key) or 0.0,
            self._tenant_of.get(key),
        )

    def _refresh(self, hashes: list[bytes], retention: str | None) -> None:
        """Extend the chain's TTL, touch it, and persist moved expiries on durable tiers."""
        for key in self.index.refresh(hashes, retention):
            for t in self.tiers:
                touch = getattr(t, "touch", None)
                if touch is not None:
                    touch(key, self.index.expires_of(key))

    def _place_new(self, key: bytes, page: torch.Tensor, meta: BlockMeta) -> int | None:
        """Put a new block into the fastest tier that takes it (and, write-through, all lower
        tiers); index it. Returns the tier it landed in, or None."""
        for i in range(len(self.tiers)):
            if self._place(i, key, page, meta):
                self.index.insert([key], i, meta.retention, parent=meta.parent, touch=False)
                if self.write_policy == "write-through":
                    for j in range(i + 1, len(self.tiers)):
                        if self._place(j, key, page, meta) and key in self.index:
                            self.index.add_tier(key, j)
                return i
        return None

    def _place(self, i: int, key: bytes, page: torch.Tensor, meta: BlockMeta) -> bool:
        tier = self.tiers[i]
        if key in tier:
            return True
        while not tier.has_room():
            if not self._evict_one(i):
                break
        try:
            if tier.has_room() and tier.put(key, page, meta):
                return True
        except Exception as exc:
            # A tier's copy failed (OOM, unusable device...): the tier released the slot and
            # the block simply is not cached there.
            self._tier_c[i]["put_errors"] += 1
            _log.warning("deepinfer_cache: %s tier put failed: %r", tier.name, exc)
            return False
        if not getattr(tier, "backlogged", bool)():  # a full write queue counts itself
            self._tier_c[i]["skipped"] += 1
        return False

    def _evict_one(self, i: int) -> bool:
        """Evict tier ``i``'s LRU leaf, demoting it down when no lower tier holds it. A victim
        that cannot move down is dropped with its subtree (never a pinned or protected chain)."""
        victim = self.index.pick_victim(i, self._protect, keep_inner_last_copies=False)
        if victim is None:
            return False
        if self.index.tiers_of(victim) >> (i + 1) == 0 and i + 1 < len(self.tiers):
            page = self.tiers[i].get(victim)
            if page is not None:
                meta = self._meta(victim)  # while it is indexed: a placement below may evict it
                for j in range(i + 1, len(self.tiers)):
                    if victim not in self.index:  # a nested eviction dropped it with an ancestor
                        break
                    if self._place(j, victim, page, meta):
                        if victim in self.index:
                            self.index.add_tier(victim, j)
                            self._c["demotions"] += 1
                        else:  # a nested eviction dropped it with an ancestor
                            self.tiers[j].delete(victim)
                        break
        self._tier_c[i]["evictions"] += 1
        if victim in self.index:
            self.tiers[i].delete(victim)
            self._free(self.index.remove_tier(victim, i), "evicted")
        return True

    def _free(self, dropped: list[Dropped], reason: str | None) -> None:
        """Delete the tier copies of blocks that left the index; publish their removal."""
        for d in dropped:
            t, i = d.tiers, 0
            while t:
                if t & 1:
                    self.tiers[i].delete(d.key)
                t >>= 1
                i += 1
            self._tenant_of.pop(d.key, None)
        if dropped and reason is not None and self._events.active:
            self._events.publish(BlockRemoved(tuple(d.key for d in dropped), reason))

    def _drain_failures(self) -> None:
        for i, t in enumerate(self.tiers):
            pop = getattr(t, "pop_failed", None)
            if pop is None:
                continue
            for key in pop():
                self._free(self.index.remove_tier(key, i), "lost")

    def _persist(self, deadline: float | None) -> tuple[int, bool]:
        """Write blocks held only in memory tiers to the disk tier, parents first; wait for
        the disk with the store lock released whenever its queue is full. Returns (blocks
        written, everything durable)."""
        d = self._durable
        if d is None:
            return 0, True
        disk: Any = self.tiers[d]
        bit = 1 << d
        with self._lock:
            todo = [k for k in self.index.keys_parents_first() if not self.index.tiers_of(k) & bit]
        written, pos, complete = 0, 0, True
        while pos < len(todo):
            with self._lock:
                self._drain_failures()
                while pos < len(todo):
                    key = todo[pos]
                    mask = self.index.tiers_of(key)
                    if not mask or mask & bit:
                        pos += 1
                        continue
                    if disk.backlogged():
                        break
                    src = (mask & -mask).bit_length() - 1
                    page = self.tiers[src].get(key)
                    if page is None:
                        pos += 1
                        continue
                    self._protect = {key}
                    try:
                        placed = self._place(d, key, page, self._meta(key))
                    finally:
                        self._protect = set()
                    if placed and key in self.index:
                        self.index.add_tier(key, d)
                        written += 1
                    elif placed:
                        self.tiers[d].delete(key)
                    elif disk.backlogged():
                        continue  # refused for a full queue: retry once it has drained
                    else:
                        complete = False  # no room, or the copy failed
                    pos += 1
            if pos < len(todo) and not disk.flush(left(deadline)):
                return written, False
        ok = disk.flush(left(deadline))
        with self._lock:
            self._drain_failures()
            if any(not self.index.tiers_of(k) & bit for k in todo if k in self.index):
                complete = False
        return written, ok and complete

    def _fetch_job(self, hashes: list[bytes], promote: bool, device: torch.device) -> FetchResult:
        pages: list[torch.Tensor] = []
        sources = [0] * len(self.tiers)
        try:
            with self._lock:
                masks = [self.index.tiers_of(k) for k in hashes]
            # Start every disk read at once: reads and checksums overlap on the reader threads.
            # A tier with ``get_many_async`` reads runs of adjacent blocks with one large read.
            pending: dict[bytes, Future[torch.Tensor | None]] = {}
            by_tier: dict[int, list[bytes]] = {}
            for key, mask in zip(hashes, masks):
                src = (mask & -mask).bit_length() - 1
                if mask and hasattr(self.tiers[src], "get_async"):
                    by_tier.setdefault(src, []).append(key)
            for src, keys in by_tier.items():
                tier: Any = self.tiers[src]
                many = getattr(tier, "get_many_async", None)
                pending.update(
                    zip(keys, many(keys) if many is not None else [tier.get_async(k) for k in keys])
                )
            for key in hashes:
                with self._lock:
                    mask = self.index.tiers_of(key)
                if not mask:
                    break
                src = (mask & -mask).bit_length() - 1
                # Popped, so that a page copied to the device is freed here (back to the disk
                # tier's page pool) instead of when the whole fetch ends.
                fut = pending.pop(key, None)
                page = fut.result() if fut is not None else self.tiers[src].get(key)
                del fut
                if page is None:
                    with self._lock:
                        self._c["fetch_failures"] += 1
                        self._free(self.index.drop(key), "corrupt")
                    break
                page = page.to(device)
                if promote and src > 0:
                    with self._lock:
                        if key in self.index and self._place(0, key, page, self._meta(key)):
                            if key in self.index:
                                self.index.add_tier(key, 0)
                                self._c["promotions"] += 1
                            else:
                                self.tiers[0].delete(key)
                sources[src] += 1
                pages.append(page)
        finally:
            with self._lock:
                self.index.unpin(hashes)
        return FetchResult(
            len(pages),
            len(pages) * self.block_size,
            pages,
            {t.name: n for t, n in zip(self.tiers, sources)},
        )

    def _rebuild(self) -> None:
        """Re-index the blocks durable tiers recovered on open."""
        now = self.clock.now()
        for i, t in enumerate(self.tiers):
            if hasattr(t, "recovered"):
                r = rebuild_index(self.index, i, t, now)
                drop = getattr(t, "drop_recovered", None)
                if drop is not None:
                    drop()
                self._c["orphans_removed"] += r.orphans
                self._c["expired"] += r.expired
                self._tenant_of.update(r.tenants)
                if r.unknown_classes:
                    warnings.warn(
                        f"deepinfer_cache: kept {r.unknown_blocks} blocks of retention classes "
                        f"the policy does not name ({', '.join(sorted(r.unknown_classes))}) "
                        "until their stored expiry",
                        RuntimeWarning,
                        stacklevel=3,
                    )
                    self._c["unknown_class_blocks"] += r.unknown_blocks
                self._check_key_scheme(t)

    def _check_key_scheme(self, tier: Tier) -> None:
        """Record this store's key scheme in a durable tier's directory; warn when blocks of
        another scheme are there (all misses under this one, never wrong hits)."""
        directory = getattr(tier, "directory", None)
        if directory is None:
            return
        others = record_key_scheme(directory, self.key_hash, len(tier) > 0)
        if others:
            warnings.warn(
                f"deepinfer_cache: {directory} holds blocks keyed with key_hash="
                f"{' / '.join(repr(k) for k in others)}; under key_hash={self.key_hash!r} they are "
                "misses (they age out by LRU/TTL); open the store with that key_hash to use them",
                RuntimeWarning,
                stacklevel=4,
            )


def left(deadline: float | None) -> float | None:
    return None if deadline is None else max(0.0, deadline - time.monotonic())
