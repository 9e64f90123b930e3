"""``DiskTier``: one crash-safe file per block under a directory on local SSD.

Layout::

    <directory>/.lock              flock held while the tier is open (one writer per directory)
    <directory>/blocks/ab/<hash>   block files (see ``disk_format``), 256 shard directories
    <directory>/tmp/               partial writes; cleared on open
    <directory>/quarantine/        files that failed a check, kept for inspection

Writes are queued to background threads through a bounded queue. ``put`` never waits on the
disk: when the queue is full it refuses the block (``False``) and counts it in
``counters.writeback_dropped``, so a caller holding a lock (the store) is never stalled by a slow
disk. Deletes and expiry updates (``touch``) are deferred to the writer threads as well. Until a
write is durable the page stays in memory and is served from there. Reads verify both
checksums; a corrupt file is moved to quarantine, counted and reported as a miss.

One concept per module: ``DiskTier`` here holds construction and the write path over the
layers of ``disk_state.py``.
"""

from __future__ import annotations

import contextlib
import os
import queue
import threading
import time
from collections import deque
from collections.abc import Sequence

import torch

from ..disk_format import encode_header, max_header_len, page_bytes_view, write_block_file
from ..io_workers import IOWorkers
from ..lockfile import DirectoryLock
from ..meta import RecoveredBlock
from .base import BlockMeta, check_key, check_page, check_page_shape, page_nbytes
from .disk_deferred import DiskDeferred
from .disk_formats import holds_segments_format, segments_format_refused
from .disk_reads import DiskReads
from .disk_recovery import DiskRecovery
from .disk_state import DiskCounters

__all__ = ["DiskCounters", "DiskTier"]


class DiskTier(DiskRecovery, DiskReads, DiskDeferred):
    """Directory-backed tier with a byte capacity (``capacity_bytes``, file sizes counted).

    ``fsync=False`` trades durability of the latest writes for speed (benchmarks, tests); the
    rename still keeps every file complete-or-absent.
    """

    name = "disk"

    def __init__(
        self,
        directory: str | os.PathLike[str],
        page_shape: Sequence[int],
        dtype: torch.dtype,
        capacity_bytes: int,
        *,
        layout: str = "page",
        fsync: bool = True,
        io_threads: int = 2,
        read_threads: int = 4,
        queue_depth: int = 32,
    ) -> None:
        if not isinstance(dtype, torch.dtype):
            raise TypeError(f"dtype must be a torch.dtype, got {dtype!r}")
        if (
            isinstance(capacity_bytes, bool)
            or not isinstance(capacity_bytes, int)
            or capacity_bytes < 0
        ):
            raise ValueError(f"capacity_bytes must be an int >= 0, got {capacity_bytes!r}")
        self.directory = os.fspath(directory)
        self.page_shape = check_page_shape(page_shape)
        self.dtype = dtype
        self.layout = layout
        self.page_bytes = page_nbytes(self.page_shape, dtype)
        # Headers are padded to a fixed length, so every block file has the same size.
        self.file_bytes = self.page_bytes + max_header_len(self.page_shape, dtype, layout)
        self.capacity_bytes = capacity_bytes
        self.fsync = fsync
        self.counters = DiskCounters()
        os.makedirs(self.directory, exist_ok=True)
        self._blocks = os.path.join(self.directory, "blocks")
        self._tmp = os.path.join(self.directory, "tmp")
        self._quarantine = os.path.join(self.directory, "quarantine")
        self._lock = threading.Lock()
        self._files: dict[bytes, int] = {}  # durable blocks -> file size
        self._pending: dict[bytes, tuple[int, torch.Tensor, int]] = {}  # gen, page, size
        self._gen = 0
        self._used = 0
        self._failed: deque[bytes] = deque()
        self._recovered: list[RecoveredBlock] = []
        # Deferred metadata work (run by writer threads, ``flush`` and ``close``): files of
        # deleted blocks to unlink and expiry times to persist in mtimes.
        self._unlinks: deque[bytes] = deque()
        self._touches: dict[bytes, float] = {}
        self._kicked = False  # a deferred-work job is queued (one is enough)
        self._dirlock = DirectoryLock(self.directory)
        try:
            if holds_segments_format(self.directory):
                raise segments_format_refused(self.directory)
            self._scan()
            self._workers = IOWorkers(io_threads, queue_depth, name="disk-write")
            self._readers = IOWorkers(read_threads, 4 * queue_depth, name="disk-read")
        except BaseException:
            self._dirlock.release()  # a failed open must not keep the directory locked
            raise

    def put(
        self, key: bytes, page: torch.Tensor, meta: BlockMeta | None, *, block: bool = False
    ) -> bool:
        """Queue a durable write; False when there is no room (the caller evicts first) or,
        unless ``block``, when the write queue is full (counted in ``writeback_dropped``).
        ``block=True`` waits for room in the queue instead: only for callers that hold no lock
        other threads need (the store never does).

        The page is copied once (to a private CPU buffer) before returning, so the caller may
        reuse its memory at once; checksum and file I/O run on the I/O threads."""
        check_key(key)
        check_page(page, self.page_shape, self.dtype)
        if meta is None:
            raise ValueError("meta is required by the disk tier (parent, retention, expiry)")
        size = self.file_bytes
        if key in self or self._used + size > self.capacity_bytes:
            return key in self
        if self.backlogged() and not block:
            with self._lock:
                self.counters.writeback_dropped += 1
            return False
        cpu_page = torch.empty(self.page_shape, dtype=self.dtype)
        cpu_page.copy_(page)
        with self._lock:
            if key in self._files or key in self._pending:
                return True
            if self._used + size > self.capacity_bytes:
                return False
            self._gen += 1
            gen = self._gen
            self._used += size
            self._pending[key] = (gen, cpu_page, size)
        try:
            # Never block: the caller may hold the store lock (back-pressure drops, counted).
            self._workers.submit(self._write, key, gen, cpu_page, meta, size, block=block)
        except queue.Full:
            with self._lock:
                cur = self._pending.get(key)
                if cur is not None and cur[0] == gen:
                    del self._pending[key]
                    self._used -= size
                self.counters.writeback_dropped += 1
            return False
        return True

    def backlogged(self) -> bool:
        """True while the write queue is full (a ``put`` now would be refused)."""
        return self._workers.full()

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every queued write is durable (or failed) and deferred deletes and expiry
        updates are done; False on timeout."""
        ok = self._workers.drain(timeout)
        self._run_deferred()
        return ok

    def close(self) -> None:
        if not self._dirlock.held:
            return
        self._workers.shutdown(wait=True)
        self._readers.shutdown(wait=True)
        self._run_deferred()
        self._dirlock.release()

    def _write(
        self, key: bytes, gen: int, page: torch.Tensor, meta: BlockMeta, reserved: int
    ) -> None:
        final = self.path_of(key)
        tmp = os.path.join(self._tmp, f"{key.hex()}.{gen}")
        t0 = time.perf_counter()
        with self._lock:
            cur = self._pending.get(key)
            if cur is None or cur[0] != gen:
                return  # deleted (or replaced) before it reached the disk
        try:
            payload = page_bytes_view(page)
            header = encode_header(key, meta, page, self.layout, payload)
            if len(header) + payload.nbytes > reserved:
                raise OSError("block header longer than reserved")
            size = len(header) + payload.nbytes
            write_block_file(final, tmp, header, payload, fsync=self.fsync, mtime=meta.expires_at)
        except OSError:
            with self._lock:
                cur = self._pending.get(key)
                if cur is not None and cur[0] == gen:
                    del self._pending[key]
                    self._used -= reserved
                self.counters.write_errors += 1
            self._failed.append(key)
            return
        with self._lock:
            self.counters.write_seconds += time.perf_counter() - t0
            self.counters.bytes_written += size
            self.counters.blocks_written += 1
            cur = self._pending.get(key)
            if cur is not None and cur[0] == gen:
                del self._pending[key]
                self._files[key] = size
                self._used += size - reserved
            elif cur is None and key not in self._files:
                # Deleted while the write was in flight.
                with contextlib.suppress(OSError):
                    os.unlink(final)
        self._run_deferred()
