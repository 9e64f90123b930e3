"""The write path of ``SegmentDiskTier``: slot reservation, appends and group commit.

``put`` reserves the next slot of the active segment under the tier lock and queues the write;
a writer thread ``pwritev``s the record header and payload into that slot, and the writer that
finds the queue empty ``fdatasync``s every segment written since (group commit). Only then does
the record enter ``_loc`` (durable) and leave ``open_slots``, which is what lets a manifest
vouch for a segment's prefix below its first open slot. Until then the block is served from
its in-memory copy in ``_pending``. A new segment file is created with its header in ``tmp/``
and renamed into place, so no crash leaves a segment without its header.
"""

from __future__ import annotations

import contextlib
import os
import queue
import threading
import time
from collections import deque
from typing import TYPE_CHECKING

import torch
import xxhash

from ..disk_format import fsync_dir, page_bytes_view
from ..io_workers import IOWorkers
from ..segment_format import (
    MAX_RETENTION_BYTES,
    RECORD_HEADER_BYTES,
    Geometry,
    encode_record_header,
    encode_segment_header,
    segment_name,
    slot_offset,
)
from ._locations import LocationTable
from ._segment_io import pwrite_all as _pwrite_all
from .base import BlockMeta, check_key, check_page

if TYPE_CHECKING:
    from .segment_disk import SegmentCounters


class _Segment:
    __slots__ = (
        "dirty",
        "fd",
        "id",
        "live",
        "lock",
        "open_slots",
        "path",
        "retired",
        "slots",
        "spare",
        "users",
    )

    def __init__(self, sid: int, path: str, slots: int = 0) -> None:
        self.id = sid
        self.path = path
        self.fd: int | None = None
        self.slots = slots  # slots reserved so far (the file may be shorter: holes)
        self.live = 0
        self.open_slots: set[int] = set()  # reserved, not yet committed
        self.users = 0  # readers inside a pread
        self.dirty = False
        self.retired = False
        self.lock = threading.Lock()
        # Idle read-only descriptions kept for the next read stream
        # (``segment_read_descriptions``): their readahead state goes on where the last stream
        # ended.
        self.spare: list[int] = []


class SegmentWrites:
    """Mixin: the writes of ``SegmentDiskTier`` (the attributes below are the tier's)."""

    if TYPE_CHECKING:
        page_shape: tuple[int, ...]
        dtype: torch.dtype
        record_bytes: int
        capacity_bytes: int
        slots_per_segment: int
        fsync: bool
        geometry: Geometry
        counters: SegmentCounters
        _lock: threading.Lock
        _sync_lock: threading.Lock
        _segdir: str
        _tmp: str
        _loc: LocationTable
        _pending: dict[bytes, tuple[int, torch.Tensor, int, int, BlockMeta]]
        _touches: dict[bytes, float]
        _unsynced: list[tuple[bytes, int, int, int, BlockMeta, int]]
        _invalid: list[tuple[int, int]]
        _segments: dict[int, _Segment]
        _active: _Segment | None
        _next_segment: int
        _gen: int
        _slot_of_gen: dict[int, tuple[_Segment, int]]
        _changed: int
        _failed: deque[bytes]
        _workers: IOWorkers

        def __contains__(self, key: object) -> bool: ...

        def has_room(self, nbytes: int | None = None) -> bool: ...

        def used_bytes(self) -> int: ...

        def backlogged(self) -> bool: ...

        def _run_deferred(self) -> None: ...

    def put(
        self, key: bytes, page: torch.Tensor, meta: BlockMeta | None, *, block: bool = False
    ) -> bool:
        """Queue a durable write; False when there is no room or (unless ``block``) the write
        queue is full (counted in ``writeback_dropped``). The page is copied before returning."""
        check_key(key)
        check_page(page, self.page_shape, self.dtype)
        if meta is None:
            raise ValueError("meta is required by the disk tier (parent, retention, expiry)")
        if len(meta.retention.encode()) > MAX_RETENTION_BYTES:
            raise ValueError(f"retention class names are at most {MAX_RETENTION_BYTES} bytes")
        if key in self or not self.has_room():
            return key in self
        if self.backlogged() and not block:
            with self._lock:
                self.counters.writeback_dropped += 1
            return False
        cpu_page = torch.empty(self.page_shape, dtype=self.dtype)
        cpu_page.copy_(page)
        with self._lock:
            if key in self._loc or key in self._pending:
                return True
            if self.used_bytes() + self.record_bytes > self.capacity_bytes:
                return False
            seg, slot = self._reserve()
            self._gen += 1
            gen = self._gen
            self._pending[key] = (gen, cpu_page, seg.id, slot, meta)
            self._slot_of_gen[gen] = (seg, slot)
        try:
            self._workers.submit(self._write, key, gen, block=block)
        except queue.Full:
            with self._lock:
                cur = self._pending.get(key)
                if cur is not None and cur[0] == gen:
                    del self._pending[key]
                self._slot_of_gen.pop(gen, None)
                seg.open_slots.discard(slot)
                self.counters.writeback_dropped += 1
            return False
        return True

    def _release_slot(self, key: bytes, gen: int) -> None:
        """A reserved slot that will never be written (caller holds the lock)."""
        got = self._slot_of_gen.pop(gen, None)
        if got is not None:
            got[0].open_slots.discard(got[1])

    def _reserve(self) -> tuple[_Segment, int]:
        s = self._active
        if s is None or s.slots >= self.slots_per_segment:
            sid = self._next_segment
            self._next_segment += 1
            s = _Segment(sid, os.path.join(self._segdir, segment_name(sid)))
            self._segments[sid] = s
            self._active = s
        slot = s.slots
        s.slots += 1
        s.open_slots.add(slot)
        return s, slot

    def _fd(self, s: _Segment) -> int:
        """The segment's descriptor, opened on first use (created with its header)."""
        with s.lock:
            if s.retired:
                raise OSError(f"segment {s.id:x} was retired")
            if s.fd is None:
                try:
                    s.fd = os.open(s.path, os.O_RDWR | os.O_CLOEXEC)
                except FileNotFoundError:
                    s.fd = self._create_segment(s)
            return s.fd

    def _create_segment(self, s: _Segment) -> int:
        """Write a new segment's header in ``tmp/`` and rename it into place: a crash never
        leaves a segment file without its header (which a reopen would rightly call damage);
        what it leaves in ``tmp/`` is cleared on open."""
        tmp = os.path.join(self._tmp, f"{segment_name(s.id)}.{time.time_ns()}")
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        try:
            _pwrite_all(fd, [encode_segment_header(self.geometry, s.id)], 0)
            if self.fsync:
                os.fsync(fd)
            os.rename(tmp, s.path)
            if self.fsync:
                fsync_dir(self._segdir)
        except BaseException:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(tmp)  # gone already once renamed: the segment then stays, complete
            raise
        return fd

    def _write(self, key: bytes, gen: int) -> None:
        with self._lock:
            cur = self._pending.get(key)
            if cur is None or cur[0] != gen:
                self._release_slot(key, gen)  # deleted before it reached the disk: a hole
                return
            _, page, sid, slot, meta = cur
            seg = self._segments[sid]
            self._slot_of_gen.pop(gen, None)
        t0 = time.perf_counter()
        try:
            payload = page_bytes_view(page)
            check = xxhash.xxh3_64_intdigest(payload)
            head = encode_record_header(key, meta, payload.nbytes, check, sid, slot)
            _pwrite_all(self._fd(seg), [head, payload], slot_offset(slot, self.record_bytes))
        except OSError:
            with self._lock:
                cur = self._pending.get(key)
                if cur is not None and cur[0] == gen:
                    del self._pending[key]
                seg.open_slots.discard(slot)
                self.counters.write_errors += 1
            self._failed.append(key)
            return
        with self._lock:
            self.counters.write_seconds += time.perf_counter() - t0
            self.counters.bytes_written += RECORD_HEADER_BYTES + payload.nbytes
            self.counters.blocks_written += 1
            self._unsynced.append((key, gen, sid, slot, meta, check))
            seg.dirty = True
            last = self._workers.queued() == 0
        # Group commit: the writer that finds the queue empty syncs every write before it.
        if last or not self.fsync:
            self._sync()
            self._run_deferred()

    def _sync(self) -> None:
        with self._sync_lock:
            with self._lock:
                batch, self._unsynced = self._unsynced, []
                dirty = [s for s in self._segments.values() if s.dirty and s.fd is not None]
                for s in dirty:
                    s.dirty = False
            failed: set[int] = set()
            if self.fsync:
                for s in dirty:
                    try:
                        os.fdatasync(s.fd)  # type: ignore[arg-type]
                    except OSError:
                        failed.add(s.id)
            with self._lock:
                for key, gen, sid, slot, meta, check in batch:
                    seg = self._segments[sid]
                    seg.open_slots.discard(slot)
                    cur = self._pending.get(key)
                    mine = cur is not None and cur[0] == gen
                    if sid in failed:
                        self.counters.write_errors += 1
                        if mine:
                            del self._pending[key]
                            self._failed.append(key)
                        continue
                    if not mine:
                        self._invalid.append((sid, slot))  # deleted while being written
                        continue
                    del self._pending[key]
                    expires = max(meta.expires_at, self._touches.pop(key, 0.0))
                    self._loc[key] = (
                        sid,
                        slot,
                        meta.parent,
                        meta.tenant,
                        meta.retention,
                        expires,
                        check,
                    )
                    seg.live += 1
                    self._changed += 1
