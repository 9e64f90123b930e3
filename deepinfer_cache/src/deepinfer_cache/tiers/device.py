"""``DeviceTier``: pages inside a torch tensor on the engine's device (cuda or cpu).

The tier either allocates its own pool ``[n, *page_shape]`` or manages chosen blocks of an
existing pool (e.g. the engine's ``[L, 2, num_blocks, block_size, H, D]`` KV pool with
``block_dim=2``); pages move through the ``gather_fn`` / ``scatter_fn`` seam.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence

import torch

from ._slots import SlotMap, SlotTier
from .base import (
    BlockMeta,
    GatherFn,
    ScatterFn,
    check_key,
    check_page,
    check_page_shape,
    torch_gather,
    torch_scatter,
)


class DeviceTier(SlotTier):
    """Device-resident page pool.

    >>> pool = torch.zeros(4, 2, 3)             # 4 blocks, page shape (2, 3)
    >>> tier = DeviceTier(pool)
    >>> tier.put(bytes(16), torch.ones(2, 3), None)
    True
    >>> float(tier.get(bytes(16)).sum())
    6.0
    """

    name = "device"

    def __init__(
        self,
        pool: torch.Tensor,
        *,
        block_dim: int = 0,
        block_ids: Sequence[int] | None = None,
        capacity_bytes: int | None = None,
        gather_fn: GatherFn | None = None,
        scatter_fn: ScatterFn | None = None,
    ) -> None:
        if not isinstance(pool, torch.Tensor):
            raise TypeError(f"pool must be a torch.Tensor, got {type(pool).__name__}")
        if not isinstance(block_dim, int) or not 0 <= block_dim < pool.dim():
            raise ValueError(f"block_dim must be in [0, {pool.dim()}), got {block_dim!r}")
        n = pool.shape[block_dim]
        ids = list(range(n)) if block_ids is None else [int(b) for b in block_ids]
        if any(not 0 <= b < n for b in ids) or len(set(ids)) != len(ids):
            raise ValueError(f"block_ids must be distinct ids in [0, {n})")
        self.pool = pool
        self.block_dim = block_dim
        self.page_shape = check_page_shape(pool.shape[:block_dim] + pool.shape[block_dim + 1 :])
        self.dtype = pool.dtype
        self.device = pool.device
        self.page_bytes = math.prod(self.page_shape) * pool.element_size()
        if capacity_bytes is not None:
            if capacity_bytes < 0:
                raise ValueError(f"capacity_bytes must be >= 0, got {capacity_bytes}")
            ids = ids[: capacity_bytes // self.page_bytes]
        self.capacity_bytes = len(ids) * self.page_bytes
        self._gather: GatherFn = gather_fn if gather_fn is not None else torch_gather
        self._scatter: ScatterFn = scatter_fn if scatter_fn is not None else torch_scatter
        self._slots = SlotMap(ids)
        self._lock = threading.Lock()

    @classmethod
    def allocate(
        cls,
        page_shape: Sequence[int],
        dtype: torch.dtype,
        capacity_bytes: int,
        device: torch.device | str = "cpu",
        **kwargs: object,
    ) -> DeviceTier:
        """A tier with its own pool of ``capacity_bytes // page_bytes`` pages."""
        page_shape = check_page_shape(page_shape)
        page_bytes = torch.empty(page_shape, dtype=dtype, device="meta").nbytes
        n = max(0, capacity_bytes // max(page_bytes, 1))
        pool = torch.zeros((n, *page_shape), dtype=dtype, device=device)
        return cls(pool, **kwargs)  # type: ignore[arg-type]

    def slot_of(self, key: bytes) -> int | None:
        """The pool block id holding ``key`` (None if absent)."""
        return self._slots.get(key)

    def put(self, key: bytes, page: torch.Tensor, meta: BlockMeta | None) -> bool:
        return self.put_many([key], page.unsqueeze(0), [meta]) == 1

    def put_many(
        self, keys: Sequence[bytes], pages: torch.Tensor, metas: Sequence[BlockMeta | None]
    ) -> int:
        """Store ``pages[i]`` under ``keys[i]`` while slots last; returns how many were stored."""
        if pages.dim() != len(self.page_shape) + 1 or pages.shape[0] != len(keys):
            raise ValueError(f"pages must be [len(keys), *{self.page_shape}]")
        check_page(
            pages[0] if len(keys) else pages.new_empty(self.page_shape), self.page_shape, self.dtype
        )
        for k in keys:
            check_key(k)
        with self._lock:
            # Keys already present keep their slot; new ones reserve a free slot, and every key
            # becomes visible only after the scatter succeeded (a failed copy leaves stale bytes).
            rows: list[int] = []
            slots: list[int] = []
            seen: set[bytes] = set()
            for r, k in enumerate(keys):
                if k in self._slots or k in seen:
                    continue
                slot = self._slots.reserve()
                if slot is None:
                    break
                rows.append(r)
                slots.append(slot)
                seen.add(k)
            else:
                r = len(keys)
            stored = r  # keys before the first one that found no room
            if slots:
                try:
                    ids = torch.tensor(slots, dtype=torch.long, device=self.device)
                    src = pages[rows].to(self.device).movedim(0, self.block_dim)
                    self._scatter(self.pool, ids, src, block_dim=self.block_dim)
                except BaseException:
                    for s in slots:
                        self._slots.unreserve(s)
                    raise
                for row, s in zip(rows, slots):
                    self._slots.commit(keys[row], s)
            return stored

    def get(self, key: bytes) -> torch.Tensor | None:
        out = self.get_many([key])
        return None if out is None else out[0]

    def get_many(self, keys: Sequence[bytes]) -> torch.Tensor | None:
        """Copies of the pages of ``keys`` stacked ``[n, *page_shape]``; None if any is absent."""
        with self._lock:
            slots = [self._slots.get(k) for k in keys]
            if any(s is None for s in slots):
                return None
            ids = torch.tensor(slots, dtype=torch.long, device=self.device)
            return self._gather(self.pool, ids, block_dim=self.block_dim).movedim(self.block_dim, 0)
