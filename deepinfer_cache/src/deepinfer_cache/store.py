"""``TieredKVStore``: prefix KV across device, host and disk tiers behind one index.

Placement: new blocks go to the fastest tier; when a tier is full its LRU leaf is demoted to
the next tier (write-back) or simply dropped when the next tier already has it (write-through
writes every new block to every tier). ``fetch`` reads host/disk blocks on I/O threads and
promotes them to the fastest tier; it returns a future so a slow disk never blocks the caller.
Blocks in use by a fetch are pinned and never evicted. Lock order: store lock -> tier lock.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any

import torch

from .clock import Clock, SystemClock
from .hashing import BlockHash, hash_token_blocks
from .index import Dropped, PrefixIndex
from .io_workers import IOWorkers
from .meta import BlockMeta
from .recovery import rebuild_index
from .results import FetchResult, LookupResult
from .retention import RetentionPolicy
from .stats import CostReport, StoreStats, TierStats
from .tiers.base import Tier

PagesArg = torch.Tensor | Callable[[list[int]], torch.Tensor]
_POLICIES = ("write-back", "write-through")


class TieredKVStore:
    """Prefix KV store over ``tiers`` (fastest first; any non-empty subset of device/host/disk).

    >>> import torch
    >>> from deepinfer_cache import HostTier
    >>> store = TieredKVStore([HostTier((2, 4), torch.float32, 1 << 20)], block_size=4)
    >>> store.store(list(range(8)), torch.ones(2, 2, 4))
    2
    >>> store.lookup(list(range(9))).num_tokens
    8
    """

    def __init__(
        self,
        tiers: Sequence[Tier],
        block_size: int,
        *,
        write_policy: str = "write-back",
        retention: RetentionPolicy | None = None,
        clock: Clock | None = None,
        fetch_threads: int = 2,
        fetch_queue_depth: int = 64,
        persist_on_close: bool = True,
    ) -> None:
        if not tiers:
            raise ValueError("tiers must name at least one tier")
        if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size <= 0:
            raise ValueError(f"block_size must be a positive int, got {block_size!r}")
        if write_policy not in _POLICIES:
            raise ValueError(f"write_policy must be one of {_POLICIES}, got {write_policy!r}")
        first = tiers[0]
        for t in tiers[1:]:
            if tuple(t.page_shape) != tuple(first.page_shape) or t.dtype != first.dtype:
                raise ValueError("all tiers must share page_shape and dtype")
        self.tiers = list(tiers)
        self.block_size = block_size
        self.write_policy = write_policy
        self.persist_on_close = persist_on_close
        self.page_shape = tuple(first.page_shape)
        self.dtype = first.dtype
        self.clock: Clock = clock if clock is not None else SystemClock()
        self.index = PrefixIndex(len(self.tiers), retention, self.clock)
        self._lock = threading.RLock()
        self._fetchers = IOWorkers(fetch_threads, fetch_queue_depth, name="fetch")
        self._c: dict[str, int] = defaultdict(int)
        self._tier_c: list[defaultdict[str, int]] = [defaultdict(int) for _ in self.tiers]
        self._closed = False
        # Never evicted (nor dropped with an ancestor) while set: the chain being stored.
        self._protect: set[bytes] = set()
        self._rebuild()

    # ------------------------------------------------------------------ public API
    def hashes(self, tokens: Any, namespace: bytes = b"") -> list[BlockHash]:
        return hash_token_blocks(tokens, self.block_size, namespace)

    def lookup(self, tokens: Any, namespace: bytes = b"", *, record: bool = True) -> LookupResult:
        """How many leading full blocks of ``tokens`` are cached, and in which tiers."""
        hashes = self.hashes(tokens, namespace)
        with self._lock:
            self._drain_failures()
            m = self.index.match(hashes)
            per_tier = [0] * len(self.tiers)
            for mask in m.tiers:
                per_tier[(mask & -mask).bit_length() - 1] += 1
            if record:
                self._c["lookups"] += 1
                self._c["query_tokens"] += len(tokens)
                self._c["hit_tokens"] += m.num_blocks * self.block_size
                for i, n in enumerate(per_tier):
                    self._tier_c[i]["hit_blocks"] += n
        return LookupResult(
            m.num_blocks,
            m.num_blocks * self.block_size,
            {t.name: n for t, n in zip(self.tiers, per_tier)},
            hashes,
        )

    def store(
        self, tokens: Any, pages: PagesArg, retention: str = "chat", namespace: bytes = b""
    ) -> int:
        """Store the full blocks of ``tokens``. ``pages`` is ``[n_full_blocks, *page_shape]`` or
        a callable returning the pages of the given block indices (only new blocks are asked
        for). Returns how many blocks were newly stored; stops at the first block no tier can
        take (counted as skipped)."""
        hashes = self.hashes(tokens, namespace)
        self.index.retention.ttl(retention)  # validates the class name early
        if isinstance(pages, torch.Tensor) and pages.shape[0] < len(hashes):
            raise ValueError(f"pages must hold {len(hashes)} blocks, got {pages.shape[0]}")
        with self._lock:
            self._check_open()
            self._drain_failures()
            present = self.index.match(hashes, touch=False).num_blocks
            new = list(range(present, len(hashes)))
            if not new:
                self._refresh(hashes, retention)
                return 0
            data = pages[present : len(hashes)] if isinstance(pages, torch.Tensor) else pages(new)
            if data.shape[0] != len(new):
                raise ValueError(f"pages callable must return {len(new)} pages")
            stored = 0
            parent = hashes[present - 1] if present else None
            expires = self.clock.now() + self.index.retention.ttl(retention)
            self._protect = set(hashes[:present])
            try:
                for j, b in enumerate(new):
                    key, page = hashes[b], data[j]
                    if self._place_new(key, page, BlockMeta(parent, retention, expires)) is None:
                        self._c["skipped_blocks"] += len(new) - j
                        break
                    self._protect.add(key)
                    stored += 1
                    parent = key
            finally:
                self._protect = set()
            self._refresh(hashes[: present + stored], retention)
            self._c["stored_blocks"] += stored
            return stored

    def fetch(
        self,
        tokens: Any,
        namespace: bytes = b"",
        *,
        max_blocks: int | None = None,
        promote: bool = True,
        device: torch.device | str | None = None,
    ) -> Future[FetchResult]:
        """Read the leading cached blocks (promoting host/disk ones to the fastest tier) on an
        I/O thread. A corrupt block ends the result early and is quarantined, never served."""
        hashes = self.hashes(tokens, namespace)[:max_blocks]
        with self._lock:
            self._check_open()
            self._drain_failures()
            self.index.match(hashes)
            n = self.index.pin(hashes)
        pinned = hashes[:n]
        target = torch.device(device) if device is not None else self._fast_device()
        try:
            return self._fetchers.submit(self._fetch_job, pinned, promote, target)
        except BaseException:
            with self._lock:
                self.index.unpin(pinned)
            raise

    def persist(self) -> int:
        """Write every block that is only in volatile tiers to the durable (disk) tier, parents
        first, and wait until it is on disk. Returns how many blocks were written. ``close``
        calls it, so a restarted engine finds the whole cache (write-back mode)."""
        durable = [i for i, t in enumerate(self.tiers) if hasattr(t, "recovered")]
        if not durable:
            return 0
        d = durable[-1]
        written = 0
        with self._lock:
            self._drain_failures()
            for key in self.index.keys_parents_first():
                mask = self.index.tiers_of(key)
                if not mask or mask & (1 << d):
                    continue
                src = (mask & -mask).bit_length() - 1
                page = self.tiers[src].get(key)
                if page is None:
                    continue
                self._protect = {key}
                try:
                    if self._place(d, key, page, self._meta(key)):
                        if key in self.index:
                            self.index.add_tier(key, d)
                            written += 1
                        else:
                            self.tiers[d].delete(key)
                finally:
                    self._protect = set()
        self.flush()
        return written

    def gc(self) -> int:
        """Expire blocks past their TTL on every tier; returns how many were dropped."""
        with self._lock:
            self._drain_failures()
            dropped = self.index.expire()
            self._free(dropped)
            self._c["expired"] += len(dropped)
            return len(dropped)

    def flush(self, timeout: float | None = None) -> bool:
        """Wait for queued fetches and disk writes; True when everything finished."""
        ok = self._fetchers.drain(timeout)
        for t in self.tiers:
            fl = getattr(t, "flush", None)
            if fl is not None:
                ok = fl(timeout) and ok
        with self._lock:
            self._drain_failures()
        return ok

    def stats(self) -> StoreStats:
        with self._lock:
            self._drain_failures()
            tiers = []
            for i, t in enumerate(self.tiers):
                tc = self._tier_c[i]
                ts = TierStats(
                    name=t.name,
                    blocks=self.index.count_in(i),
                    used_bytes=t.used_bytes(),
                    capacity_bytes=t.capacity_bytes,
                    hit_blocks=tc["hit_blocks"],
                    hit_tokens=tc["hit_blocks"] * self.block_size,
                    evictions=tc["evictions"],
                    skipped_no_room=tc["skipped"],
                )
                cnt = getattr(t, "counters", None)
                if cnt is not None:
                    ts.bytes_written, ts.bytes_read = cnt.bytes_written, cnt.bytes_read
                    ts.write_bandwidth = (
                        cnt.bytes_written / cnt.write_seconds if cnt.write_seconds else 0.0
                    )
                    ts.read_bandwidth = (
                        cnt.bytes_read / cnt.read_seconds if cnt.read_seconds else 0.0
                    )
                tiers.append(ts)
            c = self._c
            return StoreStats(
                lookups=c["lookups"],
                query_tokens=c["query_tokens"],
                hit_tokens=c["hit_tokens"],
                stored_blocks=c["stored_blocks"],
                promotions=c["promotions"],
                demotions=c["demotions"],
                expired=c["expired"],
                corrupt_quarantined=sum(
                    getattr(getattr(t, "counters", None), "corrupt_quarantined", 0)
                    for t in self.tiers
                ),
                write_errors=sum(
                    getattr(getattr(t, "counters", None), "write_errors", 0) for t in self.tiers
                ),
                orphans_removed=c["orphans_removed"],
                fetch_failures=c["fetch_failures"],
                tiers=tiers,
            )

    def cost_report(self, hit_price: float, miss_price: float) -> CostReport:
        """Prefill cost of the looked-up tokens at prices per million tokens."""
        if hit_price < 0 or miss_price < 0:
            raise ValueError("hit_price and miss_price must be >= 0")
        s = self.stats()
        return CostReport(s.hit_tokens, s.query_tokens - s.hit_tokens, hit_price, miss_price)

    def close(self) -> None:
        if self._closed:
            return
        if self.persist_on_close:
            self.persist()
        self.flush()
        self._fetchers.shutdown(wait=True)
        for t in self.tiers:
            t.close()
        self._closed = True

    def __enter__(self) -> TieredKVStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ internals
    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("the store is closed")

    def _fast_device(self) -> torch.device:
        dev = getattr(self.tiers[0], "device", None)
        return torch.device(dev) if dev is not None else torch.device("cpu")

    def _meta(self, key: bytes) -> BlockMeta:
        idx = self.index
        return BlockMeta(
            idx.parent_of(key), idx.retention_of(key) or "chat", idx.expires_of(key) or 0.0
        )

    def _refresh(self, hashes: list[bytes], retention: str) -> None:
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
        if tier.has_room() and tier.put(key, page, meta):
            return True
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
                for j in range(i + 1, len(self.tiers)):
                    if self._place(j, victim, page, self._meta(victim)):
                        if victim in self.index:
                            self.index.add_tier(victim, j)
                            self._c["demotions"] += 1
                        else:  # a nested eviction dropped it with an ancestor
                            self.tiers[j].delete(victim)
                        break
        self._tier_c[i]["evictions"] += 1
        if victim in self.index:
            self.tiers[i].delete(victim)
            self._free(self.index.remove_tier(victim, i))
        return True

    def _free(self, dropped: list[Dropped]) -> None:
        for d in dropped:
            t, i = d.tiers, 0
            while t:
                if t & 1:
                    self.tiers[i].delete(d.key)
                t >>= 1
                i += 1

    def _drain_failures(self) -> None:
        for i, t in enumerate(self.tiers):
            pop = getattr(t, "pop_failed", None)
            if pop is None:
                continue
            for key in pop():
                self._free(self.index.remove_tier(key, i))

    def _fetch_job(self, hashes: list[bytes], promote: bool, device: torch.device) -> FetchResult:
        pages: list[torch.Tensor] = []
        sources = [0] * len(self.tiers)
        try:
            with self._lock:
                masks = [self.index.tiers_of(k) for k in hashes]
            # Start every disk read at once: reads and checksums overlap on the reader threads.
            pending: dict[bytes, Future[torch.Tensor | None]] = {}
            for key, mask in zip(hashes, masks):
                src = (mask & -mask).bit_length() - 1
                get_async = getattr(self.tiers[src], "get_async", None) if mask else None
                if get_async is not None:
                    pending[key] = get_async(key)
            for key in hashes:
                with self._lock:
                    mask = self.index.tiers_of(key)
                if not mask:
                    break
                src = (mask & -mask).bit_length() - 1
                fut = pending.get(key)
                page = fut.result() if fut is not None else self.tiers[src].get(key)
                if page is None:
                    with self._lock:
                        self._c["fetch_failures"] += 1
                        self._free(self.index.drop(key))
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
                orphans, expired = rebuild_index(self.index, i, t, now)
                self._c["orphans_removed"] += orphans
                self._c["expired"] += expired
