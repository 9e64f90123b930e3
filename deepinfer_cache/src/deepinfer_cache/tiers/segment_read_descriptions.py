"""The open file descriptions a read stream of ``SegmentDiskTier`` reads through.

The kernel keeps readahead state per open file description, so each stream reads through its
own (``_own_readahead``): runs read at once through one shared descriptor look random to the
kernel and fill the page cache with 4 KiB folios (see ``segment_read.py``). A stream's
descriptions are kept idle per segment for the next stream, up to ``_SPARE_DESCRIPTIONS``.
"""

from __future__ import annotations

import contextlib
import os
import threading
from typing import TYPE_CHECKING

from ..lockfile import DirectoryLock

if TYPE_CHECKING:
    from .segment_write import _Segment

_SPARE_DESCRIPTIONS = 2  # idle descriptions kept per segment for later streams


class StreamDescriptions:
    """Mixin: the tier's side of ``_Descriptions`` (the attributes below are the tier's)."""

    # The measured choice of ``segment_read.py``'s docstring; kept as an attribute so that
    # ``benchmarks/bench_cache_into.py`` can measure the alternative in the same process.
    _own_readahead: bool = True  # each run reads through its own open file description
    # Each stream's own description is opened with ``POSIX_FADV_SEQUENTIAL`` (Linux: twice the
    # readahead window). Off: session 16's loaded A/B (results/cache.md) could not tell it
    # from plain reads; kept for the A/B. Applied when a description is opened.
    _sequential_hint: bool = False

    if TYPE_CHECKING:
        _lock: threading.Lock
        _dirlock: DirectoryLock

    def _spare_description(self, seg: _Segment) -> int | None:
        """An idle description of ``seg`` left by an earlier stream, or None."""
        with self._lock:
            return seg.spare.pop() if seg.spare else None

    def _keep_description(self, seg: _Segment, fd: int) -> None:
        """Keep a stream's description of ``seg`` for the next stream (its readahead state
        then continues a scan read in request-sized pieces), or close it: the segment was
        retired (its file must be freed), the tier closed, or enough are kept."""
        with self._lock:
            keep = not seg.retired and self._dirlock.held and len(seg.spare) < _SPARE_DESCRIPTIONS
            if keep:
                seg.spare.append(fd)
        if not keep:
            with contextlib.suppress(OSError):
                os.close(fd)


class _Descriptions:
    """The open file descriptions one read stream uses, one per segment; handed back to the
    tier (kept idle for a later stream, or closed) when the stream ends.

    The kernel keeps readahead state per open file description: a stream read through its own
    is one sequential reader (a growing window of large folios) while other threads read
    other streams of the same segment; through the tier's shared descriptor their reads
    interleave and look random. With ``own`` False the shared descriptor is used."""

    __slots__ = ("_direct", "_fds", "_tier", "own")

    def __init__(self, tier: StreamDescriptions, own: bool) -> None:
        self._tier = tier
        self.own = own
        self._fds: dict[int, tuple[_Segment, int]] = {}
        self._direct: dict[int, int | None] = {}  # segment id -> O_DIRECT description, or None

    def direct_of(self, seg: _Segment, shared: int) -> int | None:
        """An ``O_DIRECT`` description of ``seg`` for this stream (closed with it), or None
        where the platform or file system has none (then asked only once per stream)."""
        if seg.id not in self._direct:
            fd: int | None = None
            flag = getattr(os, "O_DIRECT", 0)
            if flag:
                with contextlib.suppress(OSError):
                    fd = os.open(f"/proc/self/fd/{shared}", os.O_RDONLY | os.O_CLOEXEC | flag)
            self._direct[seg.id] = fd
        return self._direct[seg.id]

    def of(self, seg: _Segment, shared: int) -> int:
        """This stream's descriptor for ``seg`` (``shared`` is the tier's, held open by the
        caller while this runs)."""
        if not self.own:
            return shared
        got = self._fds.get(seg.id)
        if got is not None:
            return got[1]
        fd = self._tier._spare_description(seg)
        if fd is None:
            fd = _own_description(shared)
            if fd == shared:  # no /proc: share it, and stop trying for this stream
                self.own = False
                return shared
            if self._tier._sequential_hint and hasattr(os, "posix_fadvise"):
                # Twice the device's readahead window for this description (Linux), so more of
                # the file is on its way while the stream's thread hashes what it has read.
                with contextlib.suppress(OSError):
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
        self._fds[seg.id] = (seg, fd)
        return fd

    def close(self) -> None:
        for seg, fd in self._fds.values():
            self._tier._keep_description(seg, fd)
        self._fds.clear()
        for direct in self._direct.values():
            if direct is not None:
                with contextlib.suppress(OSError):
                    os.close(direct)
        self._direct.clear()


def _own_description(fd: int) -> int:
    """A new open file description of ``fd``'s file, read-only, with its own readahead state
    (``/proc/self/fd`` reopens the file itself, so a segment unlinked by compaction while a
    reader holds it still reads); ``fd`` itself where ``/proc`` is not mounted."""
    try:
        return os.open(f"/proc/self/fd/{fd}", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return fd
