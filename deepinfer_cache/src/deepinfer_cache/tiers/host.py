"""``HostTier``: pages in one preallocated CPU tensor, pinned when CUDA is present so that
device <-> host copies run at full PCIe speed."""

from __future__ import annotations

import threading
from collections.abc import Sequence

import torch

from ._slots import SlotMap, SlotTier
from .base import BlockMeta, check_key, check_page, check_page_shape, page_nbytes


class HostTier(SlotTier):
    """Host-memory page pool of ``capacity_bytes // page_bytes`` pages.

    >>> tier = HostTier((2, 3), torch.float32, capacity_bytes=1024)
    >>> tier.put(bytes(16), torch.ones(2, 3), None), len(tier)
    (True, 1)
    """

    name = "host"

    def __init__(
        self,
        page_shape: Sequence[int],
        dtype: torch.dtype,
        capacity_bytes: int,
        *,
        pin_memory: bool | None = None,
    ) -> None:
        if not isinstance(dtype, torch.dtype):
            raise TypeError(f"dtype must be a torch.dtype, got {dtype!r}")
        if (
            isinstance(capacity_bytes, bool)
            or not isinstance(capacity_bytes, int)
            or capacity_bytes < 0
        ):
            raise ValueError(f"capacity_bytes must be an int >= 0, got {capacity_bytes!r}")
        self.page_shape = check_page_shape(page_shape)
        self.dtype = dtype
        self.page_bytes = page_nbytes(self.page_shape, dtype)
        n = capacity_bytes // self.page_bytes
        self.capacity_bytes = n * self.page_bytes
        pin = torch.cuda.is_available() if pin_memory is None else pin_memory
        self.pool = torch.empty((n, *self.page_shape), dtype=dtype, pin_memory=pin)
        self._slots = SlotMap(list(range(n)))
        self._lock = threading.Lock()

    def put(self, key: bytes, page: torch.Tensor, meta: BlockMeta | None) -> bool:
        check_page(page, self.page_shape, self.dtype)
        check_key(key)
        with self._lock:
            if key in self._slots:
                return True
            slot = self._slots.reserve()
            if slot is None:
                return False
            try:
                self._copy_in(slot, page)
            except BaseException:
                # The slot may hold part of the page (or another block's old bytes): it must
                # never become visible under ``key``.
                self._slots.unreserve(slot)
                raise
            self._slots.commit(key, slot)
            return True

    def _copy_in(self, slot: int, page: torch.Tensor) -> None:
        self.pool[slot].copy_(page)

    def get(self, key: bytes) -> torch.Tensor | None:
        """A copy of the page (the slot may be reused as soon as the lock is released)."""
        with self._lock:
            slot = self._slots.get(key)
            return None if slot is None else self.pool[slot].clone()

    def get_many(self, keys: Sequence[bytes]) -> torch.Tensor | None:
        with self._lock:
            slots = [self._slots.get(k) for k in keys]
            if any(s is None for s in slots):
                return None
            return self.pool.index_select(0, torch.tensor(slots, dtype=torch.long))
