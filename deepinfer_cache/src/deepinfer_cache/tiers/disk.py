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
"""

from __future__ import annotations

import contextlib
import os
import queue
import threading
import time
from collections import deque
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass

import torch

from ..disk_format import (
    CorruptBlockError,
    encode_header,
    fsync_dir,
    max_header_len,
    page_bytes_view,
    read_block_file,
    read_header_file,
    write_block_file,
)
from ..io_workers import IOWorkers
from ..lockfile import DirectoryLock
from ..meta import RecoveredBlock
from .base import BlockMeta, check_key, check_page, check_page_shape, page_nbytes
from .dir_hygiene import clear_tmp, ensure_dir, move_aside, quarantine_odd
from .disk_formats import holds_segments_format, segments_format_refused


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


class DiskTier:
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

    # ------------------------------------------------------------------ open
    def _scan(self) -> None:
        for d in (self._blocks, self._tmp, self._quarantine):
            ensure_dir(d, self.counters)
        clear_tmp(self._tmp, self._quarantine, self.counters)
        for shard in range(256):
            ensure_dir(os.path.join(self._blocks, f"{shard:02x}"), self.counters)
        fsync_dir(self._blocks)
        shard_dirs = [os.path.join(self._blocks, f"{shard:02x}") for shard in range(256)]
        for sd in shard_dirs:
            with os.scandir(sd) as it:
                listed = list(it)
            entries = []
            for e in listed:
                # Only regular files can be blocks; links, directories, FIFOs... are moved to
                # quarantine without being opened (a FIFO would block, a link may loop).
                if e.is_file(follow_symlinks=False):
                    entries.append(e)
                else:
                    self._quarantine_odd(e.path, e.name)
            for e in entries:
                try:
                    h = read_header_file(e.path)
                    if h.key.hex() != e.name:
                        raise CorruptBlockError("file name does not match the block hash")
                    self._check_layout(h.dtype, h.shape, h.layout)
                except (CorruptBlockError, OSError):
                    self._quarantine_file(e.path, e.name)
                    continue
                self._files[h.key] = h.file_len
                self._used += h.file_len
                self._recovered.append(RecoveredBlock(h.key, h.meta, e.stat().st_mtime))

    def _check_layout(self, dtype: torch.dtype, shape: tuple[int, ...], layout: str) -> None:
        if dtype != self.dtype or shape != self.page_shape or layout != self.layout:
            raise CorruptBlockError(
                f"block is {dtype} {shape} {layout!r}, tier is {self.dtype} {self.page_shape} "
                f"{self.layout!r}"
            )

    def recovered(self) -> list[RecoveredBlock]:
        """Blocks found valid on open (header-checked), with the metadata to re-index them
        (empty after ``drop_recovered``)."""
        return list(self._recovered)

    def drop_recovered(self) -> None:
        """Free the recovered list once an index holds it (the store calls this after its
        rebuild): a million small objects kept for nothing would tax every GC pass."""
        self._recovered = []

    def touch(self, key: bytes, expires_at: float) -> None:
        """Persist an extended expiry cheaply: a block file's mtime holds its latest expiry
        (set at write time, moved here), and a restart uses ``max(header expiry, mtime)``.
        Deferred to a writer thread (never waits on the disk)."""
        if key in self._files or key in self._pending:
            with self._lock:
                self._touches[key] = max(expires_at, self._touches.get(key, 0.0))
            self._kick()

    # ------------------------------------------------------------------ protocol
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

    def get(self, key: bytes) -> torch.Tensor | None:
        with self._lock:
            pend = self._pending.get(key)
            if pend is not None:
                return pend[1].clone()
            if key not in self._files:
                return None
        path = self.path_of(key)
        t0 = time.perf_counter()
        try:
            header, page = read_block_file(path)
            if header.key != key:
                raise CorruptBlockError("block hash in header does not match")
            self._check_layout(header.dtype, header.shape, header.layout)
        except FileNotFoundError:
            with self._lock:
                self._forget(key)
            self._failed.append(key)
            return None
        except (CorruptBlockError, OSError):
            with self._lock:
                if key in self._files:
                    self._forget(key)
                    self._quarantine_file(path, key.hex())
            self._failed.append(key)
            return None
        with self._lock:
            self.counters.bytes_read += header.file_len
            self.counters.blocks_read += 1
            self.counters.read_seconds += time.perf_counter() - t0
        return page

    def get_async(self, key: bytes) -> Future[torch.Tensor | None]:
        """``get`` on a reader thread, so many blocks are read (and checksummed) in parallel."""
        return self._readers.submit(self.get, key)

    def get_many(self, keys: Sequence[bytes]) -> list[torch.Tensor | None]:
        """Read ``keys`` in parallel; entry i is None when block i is missing or corrupt."""
        futs = [self.get_async(k) for k in keys]
        return [f.result() for f in futs]

    def delete(self, key: bytes) -> None:
        with self._lock:
            pend = self._pending.pop(key, None)
            if pend is not None:
                self._used -= pend[2]
                return
            if key in self._files:
                self._forget(key)
                self._touches.pop(key, None)
                self._unlinks.append(key)
        self._kick()

    def pop_failed(self) -> list[bytes]:
        """Blocks lost since the last call (write error, corrupt or vanished file)."""
        out: list[bytes] = []
        while self._failed:
            out.append(self._failed.popleft())
        return out

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

    # ------------------------------------------------------------------ deferred metadata
    def _kick(self) -> None:
        """Have a writer thread run the deferred work soon (skipped when the queue is full:
        the next write, ``flush`` or ``close`` runs it)."""
        with self._lock:
            if self._kicked:
                return
            self._kicked = True
        try:
            self._workers.submit(self._run_deferred, block=False)
        except (queue.Full, RuntimeError):
            with self._lock:
                self._kicked = False

    def _run_deferred(self) -> None:
        while True:
            with self._lock:
                self._kicked = False
                unlinks: list[str] = []
                while self._unlinks:
                    key = self._unlinks.popleft()
                    # Re-stored meanwhile: its new file replaces (or replaced) the old one.
                    if key not in self._files and key not in self._pending:
                        unlinks.append(self.path_of(key))
                # A block still being written keeps its touch until its file exists.
                touches = [(k, t) for k, t in self._touches.items() if k in self._files]
                for k, _ in touches:
                    del self._touches[k]
                self._touches = {k: t for k, t in self._touches.items() if k in self._pending}
            if not unlinks and not touches:
                return
            for path in unlinks:
                with contextlib.suppress(OSError):
                    os.unlink(path)
            for key, t in touches:
                with contextlib.suppress(OSError):
                    os.utime(self.path_of(key), (t, t))

    # ------------------------------------------------------------------ internals
    def _forget(self, key: bytes) -> None:
        size = self._files.pop(key, None)
        if size is not None:
            self._used -= size

    def _quarantine_odd(self, path: str, name: str) -> None:
        quarantine_odd(self._quarantine, path, name, self.counters)

    def _quarantine_file(self, path: str, name: str) -> None:
        self.counters.corrupt_quarantined += 1
        move_aside(self._quarantine, path, name)

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
