"""Upkeep of ``SegmentDiskTier``: the manifest checkpoint and compaction.

``_checkpoint`` snapshots the live records under the tier lock and writes them as the new
manifest (tmp -> fsync -> rename -> directory fsync); only then are the headers of records
deleted before the snapshot zeroed, so no reopen indexes a zeroed record and no tail scan
brings a deleted one back. ``_compact`` copies the live records of a sparse sealed segment
to the active one (the old copy is served until the new one is fsynced), writes a manifest
without the old segment and then deletes its file.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from typing import TYPE_CHECKING, Any

import numpy as np

from ..disk_format import page_bytes_view
from ..segment_format import (
    RECORD_HEADER_BYTES,
    Geometry,
    Manifest,
    encode_manifest,
    encode_record_header,
    slot_offset,
    write_manifest_file,
)
from ._locations import LocationTable
from ._segment_io import pwrite_all as _pwrite_all
from .base import BlockMeta

if TYPE_CHECKING:
    import torch

    from .segment_disk import SegmentCounters
    from .segment_write import _Segment

_BLANK = bytes(RECORD_HEADER_BYTES)


class SegmentMaintenance:
    """Mixin: checkpoints and compaction of ``SegmentDiskTier`` (attributes are the tier's)."""

    if TYPE_CHECKING:
        fsync: bool
        record_bytes: int
        compact_below: float
        geometry: Geometry
        counters: SegmentCounters
        _lock: threading.Lock
        _manifest_lock: threading.Lock
        _manifest: str
        _tmp: str
        _loc: LocationTable
        _segments: dict[int, _Segment]
        _active: _Segment | None
        _next_segment: int
        _invalid: list[tuple[int, int]]
        _changed: int

        def get(self, key: bytes) -> torch.Tensor | None: ...

        def _reserve(self) -> tuple[_Segment, int]: ...

        def _fd(self, s: _Segment) -> int: ...

        def _release_fd(self, s: _Segment, user: bool = False) -> None: ...

    def compact(self) -> int:
        """Copy the live records of sparse sealed segments forward and retire those segments
        now (normally the writer threads do this after deletes); returns records moved."""
        moved = 0
        while True:
            seg = self._pick_sparse()
            if seg is None:
                return moved
            moved += self._compact(seg)

    def _pick_sparse(self) -> _Segment | None:
        with self._lock:
            for s in self._segments.values():
                if s is self._active or s.open_slots or s.retired or not s.slots:
                    continue
                if s.live <= s.slots * self.compact_below:
                    return s
        return None

    def _compact(self, old: _Segment) -> int:
        """Copy ``old``'s live records to the active segment, then retire ``old``."""
        with self._lock:
            todo = self._loc.in_segment(old.id)
        moved = 0
        for key, r in todo:
            page = self.get(key)  # verified; a corrupt record is dropped and counted
            if page is None:
                continue
            with self._lock:
                if self._loc.get(key) is not r:
                    continue
                seg, slot = self._reserve()
            meta = BlockMeta(r[2], r[4], r[5], r[3])
            try:
                payload = page_bytes_view(page)
                head = encode_record_header(key, meta, payload.nbytes, r[6], seg.id, slot)
                _pwrite_all(self._fd(seg), [head, payload], slot_offset(slot, self.record_bytes))
                if self.fsync:
                    os.fdatasync(self._fd(seg))
            except OSError:
                with self._lock:
                    seg.open_slots.discard(slot)
                    self.counters.write_errors += 1
                return moved  # keep the old copy; try again later
            with self._lock:
                seg.open_slots.discard(slot)
                if self._loc.get(key) is r:
                    self._loc[key] = (seg.id, slot, *r[2:])
                    seg.live += 1
                    old.live -= 1
                    moved += 1
                    self.counters.records_compacted += 1
                else:
                    self._invalid.append((seg.id, slot))
        with self._lock:
            if old.live or old.open_slots:
                return moved
            old.retired = True
            self._segments.pop(old.id, None)
            self._changed += 1
        # The manifest that no longer lists the segment must be durable before it goes.
        if self._checkpoint(force=True):
            with contextlib.suppress(OSError):
                os.unlink(old.path)
            self.counters.segments_retired += 1
            self._release_fd(old)
        else:
            with self._lock:
                old.retired = False
                self._segments[old.id] = old
        return moved

    def _checkpoint(self, force: bool = False) -> bool:
        with self._manifest_lock:
            with self._lock:
                # Records deleted while being written (or a compaction copy that lost its
                # race) are in ``_invalid`` without counting as a change: they were never in
                # a manifest, but their headers sit in the tail a reopen scans, so they must
                # still be zeroed here or the block comes back (issue #20).
                if not force and not self._changed and not self._invalid:
                    return True
                changed, self._changed = self._changed, 0
                invalid, self._invalid = self._invalid, []
                snap = self._loc.snapshot()
                covered = {
                    s.id: (min(s.open_slots) if s.open_slots else s.slots)
                    for s in self._segments.values()
                }
                # Segments with a write still in flight: only their prefix below it is covered.
                open_from = {s.id: covered[s.id] for s in self._segments.values() if s.open_slots}
                next_segment = self._next_segment
            rows, classes = self._loc.manifest_rows(snap)
            rows = _within_covered(rows, open_from)
            head, body = encode_manifest(
                self.geometry, Manifest(next_segment, covered, classes, rows)
            )
            tmp = os.path.join(self._tmp, f"manifest.{time.time_ns()}")
            try:
                write_manifest_file(self._manifest, tmp, head, body, self.fsync)
            except OSError:
                with self._lock:
                    self._changed += changed
                    self._invalid.extend(invalid)
                    self.counters.write_errors += 1
                return False
            self.counters.manifests_written += 1
            # Only now zero the deleted records' headers (so no later tail scan can bring them
            # back): the manifest on disk no longer lists them, so no reopen ever indexes a
            # zeroed record. A crash in between keeps a deleted block that flush() had not
            # yet confirmed deleted.
            self._zero_headers(invalid)
            return True

    def _zero_headers(self, slots: list[tuple[int, int]]) -> None:
        touched = set()
        for sid, slot in slots:
            s = self._segments.get(sid)
            if s is None:
                continue
            with contextlib.suppress(OSError):
                _pwrite_all(self._fd(s), [_BLANK], slot_offset(slot, self.record_bytes))
                touched.add(s)
        if self.fsync:
            for s in touched:
                with contextlib.suppress(OSError):
                    os.fdatasync(self._fd(s))


def _within_covered(rows: np.ndarray, open_from: dict[int, int]) -> Any:
    """Drop rows at or past their segment's covered prefix (``open_from``: segments with a
    write in flight). The reopen scans those slots as the tail and finds such records there;
    listing them as well would put a row beyond what the manifest vouches for (a reopen counts
    it stale), and the manifest stays exactly "every live record below ``covered``"."""
    if not open_from or not len(rows):
        return rows
    beyond = np.zeros(len(rows), dtype=bool)
    for sid, first_open in open_from.items():
        beyond |= (rows["segment"] == sid) & (rows["slot"] >= first_open)
    return rows[~beyond] if beyond.any() else rows
