"""``SegmentDiskTier``: blocks appended to large segment files, found again through a manifest.

Layout::

    <directory>/.lock                 flock held while the tier is open (one writer)
    <directory>/segments/<id>.seg     segment files (``segment_format``): fixed-size slots
    <directory>/manifest              every live record's location and metadata
    <directory>/tmp/                  manifest being written; cleared on open
    <directory>/quarantine/           copies of records (and files) that failed a check

Why segments: one file per block costs a create, a rename and two fsyncs per block, scatters
a prompt's blocks over the disk, and makes a reopen read every block's header (minutes at a
million blocks). Here a prompt's blocks sit in consecutive slots of one file, so a fetch reads
them with a few large ``preadv`` calls; writes are appends made durable by one ``fdatasync``
per burst (group commit); a reopen reads the manifest plus the slots written after it.

Crash safety: a block becomes durable when its record is fsynced (until then it is served
from the copy in memory); ``flush()`` also writes the manifest. Every record carries its key,
segment id and slot in a checksummed header and an XXH3-64 of the payload, verified on every
read and on every tail record at open: a torn or damaged record is a miss (counted), never
served. Deleting a block drops it from the next manifest and then zeroes its record header (so no
tail scan can bring it back); segments whose records are mostly dead are compacted (live records copied forward, then the segment is retired through the manifest).
``put`` never waits on the disk (a full write queue refuses and counts ``writeback_dropped``).

One concept per module: this one holds the tier's construction, public protocol and segment
file descriptors; ``segment_recovery`` the open scan and recovered blocks, ``segment_deferred``
expiry updates, deletes and deferred upkeep, ``segment_write`` the appends and group commit,
``segment_read`` the coalesced reads (with ``segment_read_requests``,
``segment_read_descriptions`` and ``segment_read_quarantine``), ``segment_maintenance``
checkpoints and compaction, ``segment_open`` the reopen scan.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ..index_bulk import RecoveredColumns
from ..io_workers import IOWorkers
from ..lockfile import DirectoryLock
from ..page_pool import PagePool
from ..segment_format import (
    RECORD_HEADER_BYTES,
    Geometry,
    segment_name,
    slot_bytes_for,
    slot_offset,
)
from ._locations import LocationTable
from .base import BlockMeta, check_page_shape, page_nbytes
from .disk_formats import (
    MigrationReport,
    files_format_refused,
    holds_files_format,
    migrate_files_to_segments,
)
from .disk_state import DiskCounters
from .segment_deferred import SegmentDeferred
from .segment_maintenance import SegmentMaintenance
from .segment_read import SegmentReads
from .segment_recovery import SegmentRecovery
from .segment_write import SegmentWrites, _Segment


@dataclass
class SegmentCounters(DiskCounters):
    torn_records: int = 0  # tail records a crash left incomplete: skipped on open, never served
    stale_entries: int = 0  # manifest entries whose record was deleted or lost before a crash
    manifest_rejected: int = 0  # damaged manifests (moved to quarantine; segments rescanned)
    manifests_written: int = 0
    segments_retired: int = 0
    records_compacted: int = 0
    tail_records_scanned: int = 0


class SegmentDiskTier(
    SegmentWrites, SegmentReads, SegmentMaintenance, SegmentRecovery, SegmentDeferred
):
    """Directory-backed tier storing blocks in segment files (see the module docstring).

    ``capacity_bytes`` counts live records (``record_bytes`` each); dead slots are reclaimed
    by compaction (a sealed segment whose live fraction falls below ``compact_below`` has its
    live records copied forward), so the directory holds at most about
    ``capacity / compact_below`` plus one segment. ``fsync=False`` trades durability of the
    latest writes for speed; records stay checked either way.

    A directory holding blocks in ``DiskTier``'s one-file-per-block format is refused
    (``CacheFormatError``) unless ``migrate=True``, which converts them in place on open
    (``tiers/disk_formats.py``: copied, made durable, then the old files removed; the report is
    ``self.migration``).

    Pages returned by ``get``/``get_many`` come from ``page_pool`` (``read_pool_bytes`` of idle
    buffers kept, 0 for none): a page's memory is reused only after the caller has dropped
    every view of it (``page_pool``'s ownership rule), never while it is held.
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
        segment_bytes: int = 256 << 20,
        compact_below: float = 0.5,
        checkpoint_every: int = 4096,
        max_read_bytes: int = 32 << 20,
        read_pool_bytes: int = 128 << 20,
        migrate: bool = False,
    ) -> None:
        if not isinstance(dtype, torch.dtype):
            raise TypeError(f"dtype must be a torch.dtype, got {dtype!r}")
        for name, v in (("capacity_bytes", capacity_bytes), ("segment_bytes", segment_bytes)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"{name} must be an int >= 0, got {v!r}")
        if not 0.0 <= compact_below < 1.0:
            raise ValueError(f"compact_below must be in [0, 1), got {compact_below!r}")
        if (
            isinstance(checkpoint_every, bool)
            or not isinstance(checkpoint_every, int)
            or checkpoint_every < 1
        ):
            raise ValueError(f"checkpoint_every must be an int >= 1, got {checkpoint_every!r}")
        self.directory = os.fspath(directory)
        self.page_shape = check_page_shape(page_shape)
        self.dtype = dtype
        self.layout = layout
        self.page_bytes = page_nbytes(self.page_shape, dtype)
        self.record_bytes = slot_bytes_for(self.page_bytes)
        self.file_bytes = self.record_bytes  # what one block costs against the capacity
        self.geometry = Geometry(dtype, self.page_shape, layout, self.page_bytes, self.record_bytes)
        self.slots_per_segment = max(1, segment_bytes // self.record_bytes)
        self.capacity_bytes = capacity_bytes
        self.fsync = fsync
        self.compact_below = compact_below
        self.checkpoint_every = checkpoint_every
        self.max_read_slots = max(1, max_read_bytes // self.record_bytes)
        # Pages read from disk land in reused memory (no first-touch faults); see page_pool.
        # Each buffer is a whole slot's frame, so that a record can be read with O_DIRECT
        # straight into it (segment_read.py); the page lent out is its payload.
        self.page_pool = PagePool(
            self.page_bytes,
            read_pool_bytes,
            frame_bytes=self.record_bytes,
            page_offset=RECORD_HEADER_BYTES,
        )
        self.counters = SegmentCounters()
        self._segdir = os.path.join(self.directory, "segments")
        self._tmp = os.path.join(self.directory, "tmp")
        self._quarantine = os.path.join(self.directory, "quarantine")
        self._manifest = os.path.join(self.directory, "manifest")
        self._lock = threading.Lock()
        self._sync_lock = threading.Lock()
        self._manifest_lock = threading.Lock()
        self._loc = LocationTable()
        self._pending: dict[bytes, tuple[int, torch.Tensor, int, int, BlockMeta]] = {}
        self._touches: dict[bytes, float] = {}
        self._unsynced: list[tuple[bytes, int, int, int, BlockMeta, int]] = []
        self._invalid: list[tuple[int, int]] = []  # (segment, slot) headers to zero
        self._segments: dict[int, _Segment] = {}
        self._active: _Segment | None = None
        self._next_segment = 0
        self._gen = 0
        self._slot_of_gen: dict[int, tuple[_Segment, int]] = {}  # queued writes' slots
        self._changed = 0  # records changed since the last manifest
        self._kicked = False
        self._failed: deque[bytes] = deque()
        self._recovered: list[bytes] | None = None
        self._columns: RecoveredColumns | None = None
        self.migration: MigrationReport | None = None  # set when ``migrate`` converted files
        os.makedirs(self.directory, exist_ok=True)
        self._dirlock = DirectoryLock(self.directory)
        try:
            if not migrate and holds_files_format(self.directory):
                raise files_format_refused(self.directory)
            self._open()
            self._workers = IOWorkers(io_threads, queue_depth, name="seg-write")
            self._readers = IOWorkers(read_threads, 4 * queue_depth, name="seg-read")
            if migrate and holds_files_format(self.directory):
                self.migration = migrate_files_to_segments(self)
                self._recovered = list(self._loc)  # the migrated blocks are recovered too
                self._columns = None
        except BaseException:
            for workers in (getattr(self, "_workers", None), getattr(self, "_readers", None)):
                if workers is not None:
                    workers.shutdown(wait=True)
            self._close_fds()
            self._dirlock.release()  # a failed open must not keep the directory locked
            raise

    def __contains__(self, key: object) -> bool:
        return key in self._loc or key in self._pending

    def __len__(self) -> int:
        return len(self._loc) + len(self._pending)

    def used_bytes(self) -> int:
        return (len(self._loc) + len(self._pending)) * self.record_bytes

    def disk_bytes(self) -> int:
        """Bytes the segment files take, dead slots included (compaction reclaims those)."""
        return sum(s.slots for s in list(self._segments.values())) * self.record_bytes

    def has_room(self, nbytes: int | None = None) -> bool:
        need = self.record_bytes if nbytes is None else nbytes
        return self.used_bytes() + need <= self.capacity_bytes

    def keys(self) -> list[bytes]:
        with self._lock:
            return list(self._loc) + list(self._pending)

    def is_durable(self, key: bytes) -> bool:
        return key in self._loc

    def location_of(self, key: bytes) -> tuple[str, int] | None:
        """(segment file, byte offset of the record) of a durable block (tests, tools)."""
        r = self._loc.get(key)
        if r is None:
            return None
        return os.path.join(self._segdir, segment_name(r[0])), slot_offset(r[1], self.record_bytes)

    def backlogged(self) -> bool:
        return self._workers.full()

    def pop_failed(self) -> list[bytes]:
        out: list[bytes] = []
        while self._failed:
            out.append(self._failed.popleft())
        return out

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every queued write is durable (or failed), write the manifest (deletes
        become durable: the deleted records' headers are zeroed after it); False on timeout."""
        if not self._workers.drain(timeout):
            return False  # the disk is behind: do not wait on it any longer than asked
        self._sync()
        self._run_deferred()
        self._sync()
        self._checkpoint()
        return True

    def close(self) -> None:
        if not self._dirlock.held:
            return
        self._workers.shutdown(wait=True)
        self._readers.shutdown(wait=True)
        self._sync()
        self._run_deferred()
        self._sync()
        self._checkpoint()
        self._close_fds()
        self.page_pool.clear()  # idle buffers only: pages callers hold stay theirs
        self._dirlock.release()

    def _release_fd(self, s: _Segment, user: bool = False) -> None:
        with self._lock:
            if user:
                s.users -= 1
            close = s.retired and not s.users and s.fd is not None
            fd, s.fd = (s.fd, None) if close else (None, s.fd)
            spare, s.spare = (s.spare, []) if s.retired else ([], s.spare)
        for f in [*spare, *([] if fd is None else [fd])]:
            with contextlib.suppress(OSError):
                os.close(f)

    def _close_fds(self) -> None:
        for s in list(self._segments.values()):
            with self._lock:
                spare, s.spare = s.spare, []
            for f in spare:
                with contextlib.suppress(OSError):
                    os.close(f)
            if s.fd is not None:
                with contextlib.suppress(OSError):
                    os.close(s.fd)
                s.fd = None


__all__ = ["SegmentCounters", "SegmentDiskTier"]
