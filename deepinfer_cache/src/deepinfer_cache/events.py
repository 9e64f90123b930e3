"""Block stored / removed events for a cache-aware router (the ``deepinfer serve`` router).

A consumer calls ``store.subscribe()`` and polls the returned ``EventSubscription``; the store
appends events under its lock (a bounded ``deque.append``: it never waits on a consumer). If a
consumer falls more than ``maxlen`` events behind, the oldest are lost, ``overflowed`` is set and
the consumer should resynchronise from ``store.block_hashes()``. Events describe the store as a
whole (a block is "stored" when it enters the store in any tier and "removed" when its last copy
goes), which is what a router needs to know: can this replica serve this prefix from cache.
"""

from __future__ import annotations

import threading
import weakref
from collections import deque
from dataclasses import dataclass

from .hashing import BlockHash


@dataclass(frozen=True)
class BlockStored:
    """``hashes`` entered the store as one chain under ``parent`` (None: first block)."""

    hashes: tuple[BlockHash, ...]
    parent: BlockHash | None
    block_size: int
    retention: str


@dataclass(frozen=True)
class BlockRemoved:
    """``hashes`` left the store. ``reason``: ``"evicted"`` (no room), ``"expired"`` (TTL),
    ``"corrupt"`` (failed a check on read), ``"lost"`` (a write failed), ``"deleted"``
    (``delete_namespace``)."""

    hashes: tuple[BlockHash, ...]
    reason: str


@dataclass(frozen=True)
class AllBlocksCleared:
    """Every block was removed (``store.clear()``)."""


CacheEvent = BlockStored | BlockRemoved | AllBlocksCleared


class EventSubscription:
    """A bounded queue of events; ``poll`` takes what has arrived."""

    def __init__(self, hub: EventHub, maxlen: int) -> None:
        self._hub = weakref.ref(hub)
        self._q: deque[CacheEvent] = deque(maxlen=maxlen)
        self._lock = threading.Lock()
        self.dropped = 0
        self.overflowed = False

    def poll(self, max_events: int | None = None) -> list[CacheEvent]:
        """Events in the order they happened (at most ``max_events``)."""
        with self._lock:
            n = len(self._q) if max_events is None else min(max_events, len(self._q))
            return [self._q.popleft() for _ in range(n)]

    def close(self) -> None:
        hub = self._hub()
        if hub is not None:
            hub.unsubscribe(self)

    def _push(self, event: CacheEvent) -> None:
        with self._lock:
            if len(self._q) == self._q.maxlen:
                self.dropped += 1
                self.overflowed = True
            self._q.append(event)

    def __enter__(self) -> EventSubscription:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class EventHub:
    def __init__(self) -> None:
        self._subs: list[EventSubscription] = []
        self._lock = threading.Lock()

    def subscribe(self, maxlen: int = 65536) -> EventSubscription:
        if isinstance(maxlen, bool) or not isinstance(maxlen, int) or maxlen < 1:
            raise ValueError(f"maxlen must be an int >= 1, got {maxlen!r}")
        sub = EventSubscription(self, maxlen)
        with self._lock:
            self._subs = [*self._subs, sub]
        return sub

    def unsubscribe(self, sub: EventSubscription) -> None:
        with self._lock:
            self._subs = [s for s in self._subs if s is not sub]

    @property
    def active(self) -> bool:
        return bool(self._subs)

    def publish(self, event: CacheEvent) -> None:
        for s in self._subs:
            s._push(event)
