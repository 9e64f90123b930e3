"""A record of ``SegmentDiskTier`` that failed its check on a read: forgotten, a copy kept in
``quarantine/``, its header zeroed at the next checkpoint; the read is a miss."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections import deque
from typing import TYPE_CHECKING

from ..segment_format import is_blank
from ._locations import LocationTable, Rec

if TYPE_CHECKING:
    from .segment_disk import SegmentCounters
    from .segment_write import _Segment


class RecordQuarantine:
    """Mixin: ``_lost`` (the attributes below are the tier's)."""

    if TYPE_CHECKING:
        counters: SegmentCounters
        _lock: threading.Lock
        _loc: LocationTable
        _segments: dict[int, _Segment]
        _invalid: list[tuple[int, int]]
        _changed: int
        _failed: deque[bytes]
        _quarantine: str

        def _kick(self) -> None: ...

    def _lost(self, key: bytes, r: Rec, raw: bytes) -> None:
        """A record failed its check: forget it, keep a copy in quarantine, zero its header."""
        with self._lock:
            if self._loc.get(key) is not r:
                return
            del self._loc[key]
            s = self._segments.get(r[0])
            if s is not None:
                s.live -= 1
            self._invalid.append((r[0], r[1]))
            self._changed += 1
            blank = is_blank(raw)
            if blank:
                self.counters.stale_entries += 1  # deleted before a crash, manifest older
            else:
                self.counters.corrupt_quarantined += 1
        self._failed.append(key)
        if not blank:
            with contextlib.suppress(OSError):
                path = os.path.join(self._quarantine, f"{key.hex()}.record.{time.time_ns()}")
                with open(path, "wb") as f:
                    f.write(raw)
        self._kick()
