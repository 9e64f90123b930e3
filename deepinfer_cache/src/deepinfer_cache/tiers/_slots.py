"""Slot bookkeeping shared by the in-memory tiers: hash -> slot, with a free list."""

from __future__ import annotations

import threading
from array import array


class SlotMap:
    def __init__(self, slots: list[int]) -> None:
        # An array, not a list: nothing here for the cyclic GC to walk, however many slots.
        self._free = array("q", reversed(slots))
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

    def reserve(self) -> int | None:
        """A free slot, not yet mapped to any key (None when full). The caller copies the page
        in and then calls ``commit``, or ``unreserve`` when the copy failed: a key becomes
        visible only once its bytes are in the slot."""
        return self._free.pop() if self._free else None

    def commit(self, key: bytes, slot: int) -> None:
        self._slot[key] = slot

    def unreserve(self, slot: int) -> None:
        self._free.append(slot)

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
