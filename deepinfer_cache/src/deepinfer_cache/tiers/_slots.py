"""Slot bookkeeping shared by the in-memory tiers: hash -> slot, with a free list."""

from __future__ import annotations

import threading


class SlotMap:
    def __init__(self, slots: list[int]) -> None:
        self._free = list(reversed(slots))
        self._slot: dict[bytes, int] = {}
        self.num_slots = len(slots)

    def __contains__(self, key: object) -> bool:
        return key in self._slot

    def __len__(self) -> int:
        return len(self._slot)

    def get(self, key: bytes) -> int | None:
        return self._slot.get(key)

    def has_room(self) -> bool:
        return bool(self._free)

    def take(self, key: bytes) -> int | None:
        """Slot for ``key``: its existing one, a free one, or None when full."""
        slot = self._slot.get(key)
        if slot is not None:
            return slot
        if not self._free:
            return None
        slot = self._free.pop()
        self._slot[key] = slot
        return slot

    def release(self, key: bytes) -> None:
        slot = self._slot.pop(key, None)
        if slot is not None:
            self._free.append(slot)

    def keys(self) -> list[bytes]:
        return list(self._slot)


class SlotTier:
    """What the in-memory tiers share: a ``SlotMap`` of keys to pool slots behind a lock.

    Subclasses set ``_slots``, ``_lock`` and ``page_bytes`` and implement the page copies.
    """

    _slots: SlotMap
    _lock: threading.Lock
    page_bytes: int

    def __contains__(self, key: object) -> bool:
        return key in self._slots

    def __len__(self) -> int:
        return len(self._slots)

    def used_bytes(self) -> int:
        return len(self._slots) * self.page_bytes

    def has_room(self) -> bool:
        with self._lock:
            return self._slots.has_room()

    def keys(self) -> list[bytes]:
        with self._lock:
            return self._slots.keys()

    def delete(self, key: bytes) -> None:
        with self._lock:
            self._slots.release(key)

    def close(self) -> None:
        return None
