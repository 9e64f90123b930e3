"""The state of a ``DiskTier`` (`DiskTierState`): its attributes, counters, where a block's
file lives, and the bookkeeping its other parts share (forgetting a block, quarantining a
file, checking a block's layout).

``DiskTier`` is layered over this class, one concept per module: ``disk_recovery.py`` (the
scan on open and the blocks it found), ``disk_reads.py`` (reading blocks),
``disk_deferred.py`` (deletes and expiry updates left to the writer threads) and ``disk.py``
(construction and the write path).
"""

from __future__ import annotations

import os
import threading
from collections import deque
from dataclasses import dataclass

import torch

from ..disk_format import CorruptBlockError
from ..io_workers import IOWorkers
from ..lockfile import DirectoryLock
from ..meta import RecoveredBlock
from .dir_hygiene import move_aside, quarantine_odd


@dataclass
class DiskCounters:
    bytes_written: int = 0
    bytes_read: int = 0
    write_seconds: float = 0.0
    read_seconds: float = 0.0
    blocks_written: int = 0
    blocks_read: int = 0
    write_errors: int = 0
    corrupt_quarantined: int = 0
    tmp_files_removed: int = 0
    writeback_dropped: int = 0  # puts refused because the write queue was full
    odd_entries_quarantined: int = 0  # directory entries that were not block files


class DiskTierState:
    """The attributes of a ``DiskTier`` (set in its ``__init__``) and shared bookkeeping."""

    directory: str
    page_shape: tuple[int, ...]
    dtype: torch.dtype
    layout: str
    page_bytes: int
    file_bytes: int
    capacity_bytes: int
    fsync: bool
    counters: DiskCounters
    _blocks: str
    _tmp: str
    _quarantine: str
    _lock: threading.Lock
    _files: dict[bytes, int]  # durable blocks -> file size
    _pending: dict[bytes, tuple[int, torch.Tensor, int]]  # gen, page, size
    _gen: int
    _used: int
    _failed: deque[bytes]
    _recovered: list[RecoveredBlock]
    _unlinks: deque[bytes]
    _touches: dict[bytes, float]
    _kicked: bool
    _dirlock: DirectoryLock
    _workers: IOWorkers
    _readers: IOWorkers

    def __contains__(self, key: object) -> bool:
        return key in self._files or key in self._pending

    def __len__(self) -> int:
        return len(self._files) + len(self._pending)

    def used_bytes(self) -> int:
        return self._used

    def has_room(self, nbytes: int | None = None) -> bool:
        need = self.file_bytes if nbytes is None else nbytes
        return self._used + need <= self.capacity_bytes

    def keys(self) -> list[bytes]:
        with self._lock:
            return list(self._files) + list(self._pending)

    def is_durable(self, key: bytes) -> bool:
        return key in self._files

    def path_of(self, key: bytes) -> str:
        hx = key.hex()
        return os.path.join(self._blocks, hx[:2], hx)

    def _check_layout(self, dtype: torch.dtype, shape: tuple[int, ...], layout: str) -> None:
        if dtype != self.dtype or shape != self.page_shape or layout != self.layout:
            raise CorruptBlockError(
                f"block is {dtype} {shape} {layout!r}, tier is {self.dtype} {self.page_shape} "
                f"{self.layout!r}"
            )

    def _forget(self, key: bytes) -> None:
        size = self._files.pop(key, None)
        if size is not None:
            self._used -= size

    def _quarantine_odd(self, path: str, name: str) -> None:
        quarantine_odd(self._quarantine, path, name, self.counters)

    def _quarantine_file(self, path: str, name: str) -> None:
        self.counters.corrupt_quarantined += 1
        move_aside(self._quarantine, path, name)
