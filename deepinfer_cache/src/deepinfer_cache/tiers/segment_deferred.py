"""Deferred work of a ``SegmentDiskTier``: expiry extensions and deletes are recorded under
the lock and made durable by the next manifest; compaction of sparse segments and periodic
manifests run on a writer thread (``_kick``) or in ``flush``/``close``.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from ..io_workers import IOWorkers
from ._locations import LocationTable
from .base import BlockMeta
from .deferred_kick import DeferredKick

if TYPE_CHECKING:
    import torch

    from .segment_write import _Segment


class SegmentDeferred(DeferredKick):
    """Mixin: expiry updates, deletes and the deferred upkeep of ``SegmentDiskTier``
    (attributes are the tier's)."""

    if TYPE_CHECKING:
        checkpoint_every: int
        _lock: threading.Lock
        _loc: LocationTable
        _pending: dict[bytes, tuple[int, torch.Tensor, int, int, BlockMeta]]
        _touches: dict[bytes, float]
        _segments: dict[int, _Segment]
        _invalid: list[tuple[int, int]]
        _changed: int
        _kicked: bool
        _workers: IOWorkers

        def _pick_sparse(self) -> _Segment | None: ...

        def _compact(self, old: _Segment) -> int: ...

        def _checkpoint(self, force: bool = False) -> bool: ...

    def touch(self, key: bytes, expires_at: float) -> None:
        """Extend a block's expiry; persisted with the next manifest (``flush``)."""
        with self._lock:
            r = self._loc.get(key)
            if r is not None:
                if expires_at > r[5]:
                    self._loc[key] = (*r[:5], expires_at, r[6])
                    self._changed += 1
            elif key in self._pending:
                self._touches[key] = max(expires_at, self._touches.get(key, 0.0))

    def delete(self, key: bytes) -> None:
        with self._lock:
            if self._pending.pop(key, None) is not None:
                return  # the writer sees it gone and marks its slot dead
            r = self._loc.pop(key, None)
            if r is None:
                return
            self._touches.pop(key, None)
            self._segments[r[0]].live -= 1
            self._invalid.append((r[0], r[1]))
            self._changed += 1
        self._kick()

    def _run_deferred(self) -> None:
        """Compact or retire sparse segments, and write a manifest (zeroing deleted records'
        headers after it) once enough changed since the last one (writer threads, flush)."""
        with self._lock:
            self._kicked = False
        seg = self._pick_sparse()
        if seg is not None:
            self._compact(seg)
        if self._changed >= max(self.checkpoint_every, len(self._loc) // 4):
            self._checkpoint()
