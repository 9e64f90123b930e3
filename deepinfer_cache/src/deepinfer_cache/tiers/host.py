"""``HostTier``: pages in one preallocated CPU tensor, pinned when CUDA is present so that
device <-> host copies run at full PCIe speed."""

from __future__ import annotations

import threading
from collections.abc import Sequence

import torch

from ._slots import SlotMap, SlotTier
from .base import BlockMeta, check_key, check_page, page_nbytes


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
        self.page_shape = tuple(int(s) for s in page_shape)
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
        with self._lock:
            slot = self._slots.take(check_key(key))
            if slot is None:
                return False
            self.pool[slot].copy_(page)
            return True

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
