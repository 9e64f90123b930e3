"""`DeferredKick`: how a disk tier hands its deferred upkeep (``_run_deferred``) to a writer
thread, shared by ``DiskTier`` and ``SegmentDiskTier``."""

from __future__ import annotations

import queue
import threading
from typing import TYPE_CHECKING

from ..io_workers import IOWorkers


class DeferredKick:
    """Mixin: ``_kick`` (attributes and ``_run_deferred`` are the tier's)."""

    if TYPE_CHECKING:
        _lock: threading.Lock
        _kicked: bool
        _workers: IOWorkers

        def _run_deferred(self) -> None: ...

    def _kick(self) -> None:
        """Have a writer thread run the deferred work soon: one request in flight at a time,
        skipped when the writers' queue is full (the next write, ``flush`` or ``close`` runs
        it)."""
        with self._lock:
            if self._kicked:
                return
            self._kicked = True
        try:
            self._workers.submit(self._run_deferred, block=False)
        except (queue.Full, RuntimeError):
            with self._lock:
                self._kicked = False
