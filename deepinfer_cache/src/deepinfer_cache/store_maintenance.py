"""Keeping a tiered store: making it durable (``flush``, ``persist``), expiring (``gc``),
verifying the disk (``scrub``) and removing blocks (``delete_namespace``, ``clear``) (layer
of ``TieredKVStore``; see ``store.py``)."""

from __future__ import annotations

import time
from typing import Any

from .events import AllBlocksCleared
from .hashing import tenant_tag
from .store_core import StoreCore, left

_GC_STEP = 4096  # blocks expired per store-lock hold in ``gc``


class StoreMaintenance(StoreCore):
    """Durability, expiry, verification and removal."""

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
