"""``TieredKVStore``: prefix KV across device, host and disk tiers behind one index.

Placement: new blocks go to the fastest tier; when a tier is full its LRU leaf is demoted to
the next tier (write-back) or simply dropped when the next tier already has it (write-through
writes every new block to every tier). ``fetch`` reads host/disk blocks on I/O threads and
promotes them to the fastest tier; it returns a future so a slow disk never blocks the caller.
Blocks in use by a fetch are pinned and never evicted. Lock order: store lock -> tier lock.
No caller ever waits on the disk while holding the store lock: the disk tier refuses a write
when its queue is full (counted as ``writeback_dropped``), deletes are deferred to its writer
threads, and ``flush`` waits for the disk with the lock released.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from itertools import filterfalse
from typing import Any

import torch

from .block_hash_chain import BlockHashChain, chain_hashes, present_prefix
from .clock import Clock
from .events import AllBlocksCleared, BlockStored, EventSubscription
from .hashing import (
    DEFAULT_KEY_HASH,
    BlockHash,
    as_token_sequence,
    check_key_hash,
    hash_chunks,
    hash_token_blocks,
    tenant_tag,
)
from .io_workers import IOWorkers
from .meta import BlockMeta
from .results import FetchResult, LookupResult
from .retention import RetentionPolicy
from .stats import CostReport, StoreStats, collect_stats
from .store_core import StoreCore, left
from .tiers.base import Tier

PagesArg = torch.Tensor | Sequence[torch.Tensor] | Callable[[list[int]], torch.Tensor]
_GC_STEP = 4096  # blocks expired per store-lock hold in ``gc``


class TieredKVStore(StoreCore):
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

    def hashes(
        self,
        tokens: Any,
        namespace: bytes = b"",
        *,
        extra: bytes = b"",
        block_extras: Mapping[int, bytes] | None = None,
        block_hashes: BlockHashChain | None = None,
    ) -> list[BlockHash]:
        """The block hashes this store uses for ``tokens`` (its ``model`` folded in)."""
        if block_hashes is not None:
            return chain_hashes(self, tokens, namespace, extra, block_extras, block_hashes)
        return hash_token_blocks(
            tokens,
            self.block_size,
            namespace,
            model=self.model,
            extra=extra,
            block_extras=block_extras,
            key_hash=self.key_hash,
        )

    def hash_chain(self, namespace: bytes = b"", *, extra: bytes = b"") -> BlockHashChain:
        """A :class:`BlockHashChain` under this store's key scheme, model and block size: keep
        one per growing sequence and pass it as ``block_hashes=`` so that each block is hashed
        once over the sequence's life."""
        return BlockHashChain(
            self.block_size, namespace, model=self.model, extra=extra, key_hash=self.key_hash
        )

    def lookup(
        self,
        tokens: Any,
        namespace: bytes = b"",
        *,
        record: bool = True,
        extra: bytes = b"",
        block_extras: Mapping[int, bytes] | None = None,
        block_hashes: BlockHashChain | None = None,
    ) -> LookupResult:
        """How many leading full blocks of ``tokens`` are cached, and in which tiers.

        Hashes are computed lazily, outside the store lock: a miss on the first block costs
        one block hash, a miss on block k at most 8 k + 1 with the C chain (~30 ns a block)
        and 2 k + 1 without it. With ``block_hashes`` (a :class:`BlockHashChain` kept by the
        caller) only blocks the chain has not seen are hashed. The count is an upper bound of what
        ``fetch`` returns: a block whose payload turns out corrupt when read is a miss then (and
        removed); ``scrub()`` verifies every disk block ahead of time.
        """
        toks = as_token_sequence(tokens)
        computed: list[BlockHash] = []
        if block_hashes is not None:  # hashed already: probe up to the first miss only
            have = self.hashes(
                toks, namespace, extra=extra, block_extras=block_extras, block_hashes=block_hashes
            )
            probe = have[: present_prefix(self.index._ids, have) + 1]
            chunks: Any = iter([probe] if probe else [])
        else:
            chunks = hash_chunks(
                toks,
                self.block_size,
                namespace,
                self.model,
                extra,
                block_extras,
                self.key_hash,
                1,
            )
        # Hash outside the store lock, in growing chunks (1, 8, 64... blocks in C; 1, 2, 4...
        # in Python), stopping after the first block the index lacks (dict membership tests are atomic under the GIL). The
        # index never holds a block without its parent, so a chunk whose last block is known
        # is known whole: one probe per chunk. The locked match below re-checks every block.
        known = self.index._ids
        for chunk in chunks:
            if chunk[-1] in known:
                computed += chunk
                continue
            missing = next(filterfalse(known.__contains__, chunk))  # chunk[-1] at the latest
            computed += chunk[: chunk.index(missing) + 1]
            break
        with self._lock:
            self._check_open()
            self._drain_failures()
            m = self.index.match(computed)
            per_tier = [0] * len(self.tiers)
            for mask in set(m.tiers):  # a few distinct masks, each counted in C
                n = m.tiers.count(mask)
                per_tier[(mask & -mask).bit_length() - 1] += n
            if record:
                self._c["lookups"] += 1
                self._c["query_tokens"] += len(toks)
                self._c["hit_tokens"] += m.num_blocks * self.block_size
                for i, n in enumerate(per_tier):
                    self._tier_c[i]["hit_blocks"] += n
        return LookupResult(
            m.num_blocks,
            m.num_blocks * self.block_size,
            {t.name: n for t, n in zip(self.tiers, per_tier)},
            computed,
        )

    def store(
        self,
        tokens: Any,
        pages: PagesArg,
        retention: str = "chat",
        namespace: bytes = b"",
        *,
        extra: bytes = b"",
        block_extras: Mapping[int, bytes] | None = None,
        block_hashes: BlockHashChain | None = None,
    ) -> int:
        """Store the full blocks of ``tokens``. ``pages`` is ``[n_full_blocks, *page_shape]``,
        a list of such pages, or a callable returning the pages of the given block indices
        (only new blocks are asked for). Returns how many blocks were newly stored; stops at the
        first block no tier can take (counted as skipped)."""
        hashes = self.hashes(
            tokens, namespace, extra=extra, block_extras=block_extras, block_hashes=block_hashes
        )
        self.index.retention.ttl(retention)  # validates the class name early
        source = self._check_pages(pages, len(hashes))
        with self._lock:
            self._check_open()
            self._drain_failures()
            present = self.index.match(hashes, touch=False).num_blocks
            new = list(range(present, len(hashes)))
            if not new:
                self._refresh(hashes, retention)
                return 0
            data = (
                source[present : len(hashes)] if isinstance(source, torch.Tensor) else source(new)
            )
            self._check_batch(data, len(new), "pages callable")
            stored = 0
            parent = hashes[present - 1] if present else None
            expires = self.clock.now() + self.index.retention.ttl(retention)
            tenant = tenant_tag(namespace) if present == 0 else None
            self._protect = set(hashes[:present])
            try:
                for j, b in enumerate(new):
                    key, page = hashes[b], data[j]
                    meta = BlockMeta(parent, retention, expires, tenant if b == 0 else None)
                    if self._place_new(key, page, meta) is None:
                        self._c["skipped_blocks"] += len(new) - j
                        break
                    if b == 0:
                        self._tenant_of[key] = tenant_tag(namespace)
                    self._protect.add(key)
                    stored += 1
                    parent = key
            finally:
                self._protect = set()
            self._refresh(hashes[: present + stored], retention)
            self._c["stored_blocks"] += stored
            if stored and self._events.active:
                self._events.publish(
                    BlockStored(
                        tuple(hashes[present : present + stored]),
                        hashes[present - 1] if present else None,
                        self.block_size,
                        retention,
                    )
                )
            return stored

    def fetch(
        self,
        tokens: Any,
        namespace: bytes = b"",
        *,
        max_blocks: int | None = None,
        promote: bool = True,
        device: torch.device | str | None = None,
        extra: bytes = b"",
        block_extras: Mapping[int, bytes] | None = None,
        block_hashes: BlockHashChain | None = None,
    ) -> Future[FetchResult]:
        """Read the leading cached blocks (promoting host/disk ones to the fastest tier) on an
        I/O thread. A corrupt block ends the result early and is quarantined, never served.
        With ``refresh_on_hit`` (default) the blocks' TTLs restart from now."""
        if max_blocks is not None and (
            isinstance(max_blocks, bool) or not isinstance(max_blocks, int) or max_blocks < 0
        ):
            raise ValueError(f"max_blocks must be None or an int >= 0, got {max_blocks!r}")
        hashes = self.hashes(
            tokens, namespace, extra=extra, block_extras=block_extras, block_hashes=block_hashes
        )
        hashes = hashes[:max_blocks]
        with self._lock:
            self._check_open()
            self._drain_failures()
            self.index.match(hashes)
            n = self.index.pin(hashes)
            if self.refresh_on_hit and n:
                self._refresh(hashes[:n], None)
        pinned = hashes[:n]
        target = torch.device(device) if device is not None else self._fast_device()
        try:
            return self._fetchers.submit(self._fetch_job, pinned, promote, target)
        except BaseException:
            with self._lock:
                self.index.unpin(pinned)
            raise

    def lease_device(
        self,
        tokens: Any,
        namespace: bytes = b"",
        *,
        max_blocks: int | None = None,
        extra: bytes = b"",
        block_extras: Mapping[int, bytes] | None = None,
        block_hashes: BlockHashChain | None = None,
    ) -> tuple[list[int], list[BlockHash]]:
        """Pin the leading cached blocks of ``tokens`` that the first tier, a ``DeviceTier``,
        holds, and return their pool block ids (an engine reads them in place instead of
        copying) with the pinned hashes. Pinned blocks are never evicted, demoted or expired;
        hand the hashes to :meth:`release` when done. ``([], [])`` without a device tier."""
        first = self.tiers[0]
        slot_of = getattr(first, "slot_of", None)
        if slot_of is None:
            return [], []
        hashes = self.hashes(
            tokens, namespace, extra=extra, block_extras=block_extras, block_hashes=block_hashes
        )
        hashes = hashes[:max_blocks]
        ids: list[int] = []
        with self._lock:
            self._check_open()
            self._drain_failures()
            for h in hashes:
                slot = slot_of(h) if h in self.index else None
                if slot is None:
                    break
                ids.append(int(slot))
            n = self.index.pin(hashes[: len(ids)])
            if self.refresh_on_hit and n:
                self._refresh(hashes[:n], None)
        return ids[:n], hashes[:n]

    def release(self, hashes: Sequence[BlockHash]) -> None:
        """Unpin blocks pinned by :meth:`lease_device`."""
        with self._lock:
            self.index.unpin(list(hashes))

    def flush(self, timeout: float | None = None) -> bool:
        """Make every block the store holds durable, in both write modes: blocks held only in
        memory tiers are written to the disk tier (parents first), then this waits until every
        write is on disk (fsynced). Returns True when everything held is durable; False on
        timeout or when the disk tier could not take a block (full, write error). The store
        lock is released while waiting, so lookups and stores go on meanwhile. Without a disk
        tier there is nothing to make durable: it waits for fetches and returns True."""
        deadline = None if timeout is None else time.monotonic() + timeout
        _, ok = self._persist(deadline)
        ok = self._fetchers.drain(left(deadline)) and ok
        with self._lock:
            self._drain_failures()
        return ok

    def persist(self) -> int:
        """``flush()``, returning how many blocks were written from memory tiers to disk."""
        written, _ = self._persist(None)
        with self._lock:
            self._drain_failures()
        return written

    def gc(self) -> int:
        """Expire blocks past their TTL on every tier; returns how many were dropped. Works in
        steps of a few thousand blocks, releasing the store lock between steps."""
        total = 0
        while True:
            with self._lock:
                self._check_open()
                self._drain_failures()
                dropped = self.index.expire(limit=_GC_STEP)
                self._free(dropped, "expired")
                self._c["expired"] += len(dropped)
            total += len(dropped)
            if len(dropped) < _GC_STEP:
                return total

    def scrub(self) -> int:
        """Read and verify every block of the disk tier (reader threads); corrupt ones are
        quarantined and removed, so ``lookup`` no longer counts them. Returns how many were
        removed."""
        if self._durable is None:
            return 0
        d = self._durable
        with self._lock:
            self._check_open()
            keys = self.index.keys_in(d)
        disk: Any = self.tiers[d]
        bad = 0
        for page in disk.get_many(keys):
            bad += page is None
        with self._lock:
            self._drain_failures()
        return bad

    def delete_namespace(self, namespace: bytes) -> int:
        """Remove every block stored under ``namespace`` (all tiers, disk files included, any
        ``extra`` material); returns how many blocks were removed. Blocks in use (pinned by a
        fetch in flight or a device lease) stay until released: call again afterwards (their
        slots may be being read in place, so they are never freed under a reader)."""
        tag = tenant_tag(namespace)
        removed = 0
        with self._lock:
            self._check_open()
            self._drain_failures()
            firsts = [k for k, t in self._tenant_of.items() if t == tag]
            for key in firsts:
                dropped = self.index.drop_unpinned(key)
                removed += len(dropped)
                self._free(dropped, "deleted")
            self._c["deleted_blocks"] += removed
        return removed

    def clear(self) -> int:
        """Remove every block from every tier (disk files included) except blocks in use
        (pinned, as in ``delete_namespace``); returns how many were removed. Publishes
        ``AllBlocksCleared`` when nothing is left, ``BlockRemoved`` events otherwise."""
        with self._lock:
            self._check_open()
            self._drain_failures()
            dropped = []
            for key in self.index.roots():
                dropped.extend(self.index.drop_unpinned(key))
            empty = len(self.index) == 0
            self._free(dropped, None if empty else "deleted")
            self._c["deleted_blocks"] += len(dropped)
            if empty:
                self._events.publish(AllBlocksCleared())
        return len(dropped)

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
