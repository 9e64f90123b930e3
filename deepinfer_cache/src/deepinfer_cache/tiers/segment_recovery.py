"""Opening a ``SegmentDiskTier``: run the reopen scan (``segment_open``), take its counts,
locations and segments, and hand the recovered blocks to the store (as objects or as
columns), quarantining what the scan rejects.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from ..disk_format import fsync_dir
from ..index_bulk import RecoveredColumns, paused_gc
from ..meta import RecoveredBlock
from ..segment_format import Geometry, segment_name
from ._locations import LocationTable
from .base import BlockMeta
from .dir_hygiene import clear_tmp, ensure_dir, move_aside, quarantine_odd
from .segment_open import load_segments
from .segment_write import _Segment

if TYPE_CHECKING:
    from .segment_disk import SegmentCounters


class SegmentRecovery:
    """Mixin: the open scan and recovered blocks of ``SegmentDiskTier`` (attributes are the
    tier's)."""

    if TYPE_CHECKING:
        directory: str
        geometry: Geometry
        counters: SegmentCounters
        _segdir: str
        _tmp: str
        _quarantine: str
        _manifest: str
        _loc: LocationTable
        _segments: dict[int, _Segment]
        _next_segment: int
        _changed: int
        _recovered: list[bytes] | None
        _columns: RecoveredColumns | None

    def _open(self) -> None:
        for d in (self._segdir, self._tmp, self._quarantine):
            ensure_dir(d, self.counters)
        clear_tmp(self._tmp, self._quarantine, self.counters)
        with paused_gc():
            st = load_segments(
                self._segdir,
                self._manifest,
                self.geometry,
                self._quarantine_path,
                self._quarantine_odd,
            )
        c = self.counters
        c.torn_records += st.torn_records
        c.stale_entries += st.stale_entries
        c.corrupt_quarantined += st.corrupt
        c.manifest_rejected += st.manifest_rejected
        c.segments_retired += st.segments_retired
        c.tail_records_scanned += st.tail_records
        self._loc = st.table
        self._next_segment = st.next_segment
        for sid, n in st.slots.items():
            self._segments[sid] = _Segment(sid, os.path.join(self._segdir, segment_name(sid)), n)
        for sid, live in self._loc.live_per_segment().items():
            self._segments[sid].live = live
        self._columns = st.columns
        self._recovered = list(self._loc)
        # Every new write goes to a fresh segment; old ones (torn tails included) are sealed.
        if st.tail_records or st.stale_entries or st.segments_retired or not st.manifest_found:
            self._changed = 1
        fsync_dir(self.directory)

    def recovered(self) -> list[RecoveredBlock]:
        """Blocks found on open with the metadata to re-index them (``mtime`` holds the
        latest expiry persisted for each; empty after ``drop_recovered``)."""
        out = []
        for k in self._recovered or ():
            r = self._loc.get(k)
            if r is not None:
                out.append(RecoveredBlock(k, BlockMeta(r[2], r[4], r[5], r[3]), r[5]))
        return out

    def recovered_columns(self) -> RecoveredColumns:
        """``recovered()`` as parallel lists (what ``index_bulk.bulk_load`` takes): no object
        per block, so a reopen of a million blocks stays within seconds."""
        cols, self._columns = self._columns, None
        if cols is not None and len(self._loc) == len(cols.keys) == len(self._recovered or ()):
            return cols  # straight from the manifest (nothing deleted or added since open)
        recs = [(k, r) for k in self._recovered or () if (r := self._loc.get(k)) is not None]
        return RecoveredColumns(
            [k for k, _ in recs],
            [r[2] for _, r in recs],
            [r[4] for _, r in recs],
            [r[5] for _, r in recs],
            [r[3] for _, r in recs],
        )

    def drop_recovered(self) -> None:
        self._recovered = None
        self._columns = None

    def _quarantine_odd(self, path: str, name: str) -> None:
        quarantine_odd(self._quarantine, path, name, self.counters)

    def _quarantine_path(self, path: str, name: str) -> None:
        move_aside(self._quarantine, path, name)
