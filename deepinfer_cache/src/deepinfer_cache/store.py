"""``TieredKVStore``: prefix KV across device, host and disk tiers behind one index.

Placement: new blocks go to the fastest tier; when a tier is full its LRU leaf is demoted to
the next tier (write-back) or simply dropped when the next tier already has it (write-through
writes every new block to every tier). ``fetch`` reads host/disk blocks on I/O threads and
promotes them to the fastest tier; it returns a future so a slow disk never blocks the caller.
Blocks in use by a fetch are pinned and never evicted. Lock order: store lock -> tier lock.
No caller ever waits on the disk while holding the store lock: the disk tier refuses a write
when its queue is full (counted as ``writeback_dropped``), deletes are deferred to its writer
threads, and ``flush`` waits for the disk with the lock released.

One concept per module: ``TieredKVStore`` here holds construction, events, statistics and
closing over the layers ``store_core.py`` (state and internals), ``store_keys.py`` (block
hashes), ``store_reads.py`` (lookup, fetch, leases), ``store_writes.py`` (storing) and
``store_maintenance.py`` (durability, expiry, scrubbing, removal).
"""

from __future__ import annotations

from collections.abc import Sequence

from .clock import Clock
from .events import EventSubscription
from .hashing import DEFAULT_KEY_HASH, BlockHash, check_key_hash
from .io_workers import IOWorkers
from .retention import RetentionPolicy
from .stats import CostReport, StoreStats, collect_stats
from .store_maintenance import StoreMaintenance
from .store_reads import StoreReads
from .store_writes import PagesArg, StoreWrites
from .tiers.base import Tier

__all__ = ["PagesArg", "TieredKVStore"]


class TieredKVStore(StoreReads, StoreWrites, StoreMaintenance):
    """Prefix KV store over ``tiers`` (fastest first; any non-empty subset of device/host/disk).

    ``model`` (bytes: a weights fingerprint or a name) goes into every block hash, so two
    models sharing one directory never see each other's KV. ``key_hash`` picks the block-key
    scheme: ``"xxh3_128"`` (default, fast, non-cryptographic) or ``"blake2b"`` (cryptographic,
    the keys of releases before it; see ``deepinfer_cache.hashing``). Blocks stored under one
    scheme are misses under the other. The store owns its tiers: it closes
    them on ``close()`` and when its own construction fails.

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
        model: bytes = b"",
        refresh_on_hit: bool = True,
        key_hash: str = DEFAULT_KEY_HASH,
    ) -> None:
        try:
            self._init(tiers, block_size, write_policy, retention, clock, model)
            self.key_hash = check_key_hash(key_hash)
            self.persist_on_close = persist_on_close
            self.refresh_on_hit = refresh_on_hit
            self._fetchers = IOWorkers(fetch_threads, fetch_queue_depth, name="fetch")
            self._rebuild()
        except BaseException:
            # A failed open must release what it took (the disk tier's directory lock).
            for t in tiers if isinstance(tiers, Sequence) else ():
                close = getattr(t, "close", None)
                if close is not None:
                    close()
            raise

    def block_hashes(self) -> list[BlockHash]:
        """Every block the store holds, parents first (a router's resync after an event
        overflow)."""
        with self._lock:
            return self.index.keys_parents_first()

    def subscribe(self, maxlen: int = 65536) -> EventSubscription:
        """A queue of ``BlockStored`` / ``BlockRemoved`` / ``AllBlocksCleared`` events (see
        ``deepinfer_cache.events``); keeps at most ``maxlen`` unread events."""
        return self._events.subscribe(maxlen)

    def stats(self) -> StoreStats:
        with self._lock:
            self._drain_failures()
            return collect_stats(self)

    def cost_report(self, hit_price: float, miss_price: float) -> CostReport:
        """Prefill cost of the looked-up tokens at prices per million tokens."""
        if hit_price < 0 or miss_price < 0:
            raise ValueError("hit_price and miss_price must be >= 0")
        s = self.stats()
        return CostReport(s.hit_tokens, s.query_tokens - s.hit_tokens, hit_price, miss_price)

    def close(self) -> None:
        if self._closed:
            return
        try:
            if self.persist_on_close:
                self.flush()
            else:
                self._fetchers.drain()
            self._fetchers.shutdown(wait=True)
        finally:
            self._closed = True
            for t in self.tiers:
                t.close()

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self) -> TieredKVStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
