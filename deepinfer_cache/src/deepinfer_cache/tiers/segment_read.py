"""The read path of ``SegmentDiskTier``: runs of adjacent records read with one ``preadv``.

Blocks stored together sit in consecutive slots of one segment, so a request for many blocks
is grouped into runs of consecutive slots (up to ``max_read_bytes``), and each run is read
front to back by ``preadv`` calls of about 1 MiB whose buffers put the record headers in a
scratch buffer and the payloads straight into their destination (a page from the tier's
``PagePool``, or the caller's buffer for ``get_many_into``), each piece checked while it is
still in the CPU cache; runs are read in parallel on the reader threads, each through its own
open file description (see ``_own_readahead``). Every record is checked (header CRC, its
segment/slot/key, XXH3-64 of the payload) before its page is returned; a record that fails is
forgotten, a copy is kept in ``quarantine/`` and it is a miss. Where the C reader
(``native_read.py``) is available, a whole run's reads and payload hashes are one call without
the GIL, in the same pieces; the headers and digests are still checked here, record by record.

Reads into the page pool (``get``/``get_many``) go around the page cache (session 16): the
pool's buffers are frames of a whole slot, and each run's slots are read with ``O_DIRECT``
straight into them (``_direct_reads``; the C reader's ``direct`` mode), with no kernel copy;
a run the direct read does not finish is read again buffered before any record is judged.

Why no ``POSIX_FADV_WILLNEED`` and why a descriptor per run (measured, Linux 6.18 / ext4,
``benchmarks/results/cache.md`` session 14): the kernel's own readahead of a sequential reader
fills the page cache with large folios, while ``WILLNEED`` (``force_page_cache_ra``) and reads
the kernel judges random fill it with 4 KiB ones, 90x more folios to allocate, charge, insert,
copy from and evict: 0.84-0.90 s of CPU per GB instead of 0.37-0.42. Runs read at once through
one shared descriptor look random to the kernel, because readahead state lives in the open
file description.

One concept per module: this one reads a run (``_read_run``, in Python or through the C
reader); ``segment_read_requests`` splits a request into runs and streams and holds the public
reads, ``segment_read_descriptions`` the per-stream open file descriptions,
``segment_read_quarantine`` what happens to a record that fails its check.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import xxhash

from ..disk_format import CorruptBlockError
from ..native_read import RecordReader, record_reader
from ..page_pool import PagePool
from ..segment_format import (
    RECORD_HEADER_BYTES,
    Geometry,
    check_record_parts,
    slot_offset,
)
from ..segment_run_check import check_run_heads
from ._locations import LocationTable, Rec
from ._segment_io import preadv_all as _preadv_all
from .segment_read_descriptions import _Descriptions
from .segment_read_quarantine import RecordQuarantine
from .segment_read_requests import SegmentReadRequests

_HOT_BYTES = 1 << 20  # bytes read per preadv before they are checked (fits a core's L2)
# A payload larger than _HOT_BYTES is read and hashed in pieces of this size (XXH3 streams):
# each piece is hashed while the kernel's copy of it is still in the core's 512 KiB L2,
# instead of the whole 2 MiB page after it has gone to L3.
_PIECE_BYTES = 256 << 10
# Bytes per O_DIRECT preadv (whole slots): on the development VM's virtio disk one 4-8 MiB
# request at a time read 2.1-2.6 GB/s, 2 MiB ones 1.5-2.3 (session 16, results/cache.md).
_DIRECT_BATCH_BYTES = 8 << 20
_DIRECT_ALIGN = 4096  # O_DIRECT: memory, offsets and lengths in whole logical blocks

if TYPE_CHECKING:
    from .segment_disk import SegmentCounters
    from .segment_write import _Segment


class SegmentReads(SegmentReadRequests, RecordQuarantine):
    """Mixin: the reads of ``SegmentDiskTier`` (the attributes below are the tier's)."""

    _native_read: bool = True  # read and hash runs in C when it is available (native_read.py)
    # In C, read on a second thread while this one hashes. Off: loaded A/Bs (session 15,
    # results/cache.md) gave it more CPU (0.51-0.69 s/GB against 0.33-0.48: the reading
    # thread's copy lands in another core's cache) and a lower wall ratio (0.31-0.82 against
    # 0.22-1.93, medians 0.52 / 0.66); ``bench_cache_into.py`` keeps the A/B for a quiet run.
    _read_overlap: bool = False
    # Reads into the page pool's frames go through an O_DIRECT description where the file
    # system takes one (falling back to the buffered read for a run it does not finish): no
    # page cache, so no kernel copy and none of this VM's slow first touches of page-cache
    # memory (session 16, results/cache.md). ``get_many_into`` (the caller's rows, not
    # frames) always reads buffered.
    _direct_reads: bool = True
    # Direct reads are made by this many threads (0: the calling thread reads and hashes in
    # turn) while the calling thread hashes what has arrived: they only wait for the disk (no
    # copy, so none of ``_read_overlap``'s cache cost), and with two, two requests are in
    # flight (O_DIRECT has no readahead). Session 16's loaded A/Bs in results/cache.md.
    _direct_readers: int = 2

    if TYPE_CHECKING:
        page_bytes: int
        geometry: Geometry
        counters: SegmentCounters
        _lock: threading.Lock
        _pending: dict[bytes, tuple[int, torch.Tensor, int, int, Any]]
        _loc: LocationTable
        _segments: dict[int, _Segment]
        page_pool: PagePool

        def _release_fd(self, s: _Segment, user: bool = False) -> None: ...

    def _read_run(
        self,
        keys: Sequence[bytes],
        dest: Sequence[torch.Tensor] | None = None,
        fds: _Descriptions | None = None,
    ) -> list[torch.Tensor | None]:
        """Read ``keys`` (consecutive slots of one segment, or a single key) front to back
        with ``preadv`` calls of about ``_HOT_BYTES``: record headers go to a scratch buffer,
        payloads straight into ``dest`` rows (uint8, ``page_bytes`` each; ``page_pool``'s when None)
        and are verified there."""
        n = len(keys)
        frames = dest is None  # pool pages: each the payload of a whole slot's frame
        if dest is None:
            dest = self.page_pool.take(n)
        out: list[torch.Tensor | None] = [None] * n
        with self._lock:
            recs: list[Rec | None] = []
            for i, k in enumerate(keys):
                pend = self._pending.get(k)
                if pend is not None:
                    dest[i].copy_(pend[1].reshape(-1).view(torch.uint8))
                    out[i] = self._as_page(dest[i])
                    recs.append(None)
                else:
                    recs.append(self._loc.get(k))
            todo = [i for i, r in enumerate(recs) if r is not None]
            if not todo:
                return out
            first_rec = recs[todo[0]]
            assert first_rec is not None
            seg = self._segments.get(first_rec[0])
            consecutive = all(
                r is not None and r[0] == first_rec[0] and r[1] == first_rec[1] + j
                for j, r in enumerate(recs[i] for i in todo)
            )
            if seg is not None and consecutive:
                seg.users += 1
        if seg is None:
            return out
        if not consecutive:  # not one run: read each on its own
            for i in todo:
                out[i] = self._read_run([keys[i]], [dest[i]], fds)[0]
            return out
        sb = self.record_bytes
        pad = sb - RECORD_HEADER_BYTES - self.page_bytes
        heads = bytearray(RECORD_HEADER_BYTES * len(todo))
        hv = memoryview(heads)
        scratch = memoryview(bytearray(pad))
        # Read the run in pieces of about _HOT_BYTES, each checked right after its read while
        # it is still in the CPU cache (hashing a payload that an 8 MiB read already pushed
        # out of the cache costs several times more); the pieces are consecutive, so the
        # disk still sees one sequential stream (and the run was announced with WILLNEED).
        per_read = max(1, _HOT_BYTES // sb)
        pieces = per_read == 1 and self.page_bytes > _PIECE_BYTES
        t0 = time.perf_counter()
        nread = 0
        own = fds is None
        if fds is None:
            fds = _Descriptions(self, self._own_readahead)
        try:
            try:
                fd: int | None = fds.of(seg, self._fd(seg))
            except OSError:
                fd = None
            reader = record_reader() if self._native_read else None
            if reader is not None and fd is not None:
                direct = None
                if frames and self._direct_reads:
                    with contextlib.suppress(OSError):
                        direct = fds.direct_of(seg, self._fd(seg))
                nread = self._read_run_native(reader, fd, keys, recs, todo, dest, out, direct)
                todo = []  # read above
            for lo in range(0, len(todo), per_read):
                part = todo[lo : lo + per_read]
                if pieces:  # one large record: read and hash it piece by piece
                    i = part[0]
                    r = recs[i]
                    assert r is not None
                    head = hv[lo * RECORD_HEADER_BYTES : (lo + 1) * RECORD_HEADER_BYTES]
                    payload = _bytes_of(dest[i])
                    try:
                        if fd is None:
                            raise CorruptBlockError("segment file cannot be opened")
                        digest = _read_hashed(fd, head, payload, slot_offset(first_rec[1] + lo, sb))
                        if digest is None:
                            raise CorruptBlockError("record beyond the end of its segment")
                        check_record_parts(
                            head, payload, self.geometry, r[0], r[1], keys[i], digest
                        )
                    except (CorruptBlockError, OSError):
                        self._lost(keys[i], r, bytes(head) + bytes(payload))
                        continue
                    out[i] = self._as_page(dest[i])
                    nread += 1
                    continue
                iov: list[memoryview] = []
                for j, i in enumerate(part, lo):
                    if j > lo:
                        iov.append(scratch)
                    iov.append(hv[j * RECORD_HEADER_BYTES : (j + 1) * RECORD_HEADER_BYTES])
                    iov.append(_bytes_of(dest[i]))
                try:
                    got = (
                        0
                        if fd is None
                        else _preadv_all(fd, iov, slot_offset(first_rec[1] + lo, sb))
                    )
                except OSError:
                    got = 0
                for j, i in enumerate(part, lo):
                    r = recs[i]
                    assert r is not None
                    head = hv[j * RECORD_HEADER_BYTES : (j + 1) * RECORD_HEADER_BYTES]
                    payload = _bytes_of(dest[i])
                    try:
                        if (j - lo) * sb + RECORD_HEADER_BYTES + self.page_bytes > got:
                            raise CorruptBlockError("record beyond the end of its segment")
                        check_record_parts(head, payload, self.geometry, r[0], r[1], keys[i])
                    except CorruptBlockError:
                        self._lost(keys[i], r, bytes(head) + bytes(payload))
                        continue
                    out[i] = self._as_page(dest[i])
                    nread += 1
        finally:
            if own:
                fds.close()
            self._release_fd(seg, user=True)
        with self._lock:
            self.counters.bytes_read += nread * (RECORD_HEADER_BYTES + self.page_bytes)
            self.counters.blocks_read += nread
            self.counters.read_seconds += time.perf_counter() - t0
        return out

    def _read_run_native(
        self,
        reader: RecordReader,
        fd: int,
        keys: Sequence[bytes],
        recs: list[Rec | None],
        todo: list[int],
        dest: Sequence[torch.Tensor],
        out: list[torch.Tensor | None],
        direct_fd: int | None = None,
    ) -> int:
        """``_read_run``'s reads in one C call (``native_read.py``): the records of ``todo``
        (consecutive slots) read and their payloads hashed without the GIL, then every header
        checked and every digest compared here in one pass (``check_run_heads``: the same
        conditions as the Python loop's ``check_record_parts``). With ``direct_fd`` (an
        ``O_DIRECT`` description; ``dest`` rows are then frame payloads) the slots are read
        whole into their frames; a run the direct read does not finish (a short read, an
        error, memory or offsets it cannot use) is read again buffered, so a record is only
        judged on what the buffered read gives. Returns how many records passed."""
        first = recs[todo[0]]
        assert first is not None
        n = len(todo)
        raw_heads = bytearray(n * RECORD_HEADER_BYTES)
        heads = np.frombuffer(raw_heads, dtype=np.uint8)  # writable: over a bytearray
        offset = slot_offset(first[1], self.record_bytes)
        ptrs = [dest[i].data_ptr() for i in todo]
        done: list[bool] = []
        if direct_fd is not None and _direct_aligned(offset, self.record_bytes, ptrs):
            done, digests, _error = reader(
                direct_fd,
                offset,
                self.record_bytes,
                RECORD_HEADER_BYTES,
                ptrs,
                self.page_bytes,
                heads,
                self.page_bytes,  # whole payloads: direct reads leave nothing in the cache
                _DIRECT_BATCH_BYTES,
                self._direct_readers,
                True,
            )
        if not all(done) or not done:
            # Large pages are read in pieces (each hashed while still in the core's cache),
            # small ones about _HOT_BYTES of records a read, as the Python loop reads them.
            hot = _PIECE_BYTES if self.page_bytes > _PIECE_BYTES else _HOT_BYTES
            done, digests, _error = reader(
                fd,
                offset,
                self.record_bytes,
                RECORD_HEADER_BYTES,
                ptrs,
                self.page_bytes,
                heads,
                _PIECE_BYTES,
                hot,
                self._read_overlap,
            )
        # A failed read (``_error``) leaves the records it did not finish not done: each is a
        # miss below, as when the Python loop's read raises.
        ok = check_run_heads(
            raw_heads,
            page_bytes=self.page_bytes,
            segment=first[0],
            first_slot=first[1],
            keys=[keys[i] for i in todo],
            digests=digests,
        )
        hv = memoryview(raw_heads)
        nread = 0
        for j, i in enumerate(todo):
            if done[j] and ok[j]:
                out[i] = self._as_page(dest[i])
                nread += 1
                continue
            r = recs[i]
            assert r is not None
            head = hv[j * RECORD_HEADER_BYTES : (j + 1) * RECORD_HEADER_BYTES]
            self._lost(keys[i], r, bytes(head) + bytes(_bytes_of(dest[i])))
        return nread

    def _as_page(self, row: torch.Tensor) -> torch.Tensor:
        return row.view(self.dtype).reshape(self.page_shape)


def _direct_aligned(offset: int, slot_bytes: int, payloads: Sequence[int]) -> bool:
    """Whether whole slots from ``offset`` can be read with O_DIRECT into the frames that
    start ``RECORD_HEADER_BYTES`` before ``payloads``."""
    return (
        offset % _DIRECT_ALIGN == 0
        and slot_bytes % _DIRECT_ALIGN == 0
        and all((p - RECORD_HEADER_BYTES) % _DIRECT_ALIGN == 0 for p in payloads)
    )


def _bytes_of(row: torch.Tensor) -> memoryview:
    """A writable byte view of a contiguous CPU uint8 tensor (no copy)."""
    arr: Any = row.numpy()
    return memoryview(arr)


def _read_hashed(fd: int, head: memoryview, payload: memoryview, offset: int) -> int | None:
    """Read the record at ``offset`` (header into ``head``, payload into ``payload``) in pieces
    of ``_PIECE_BYTES``, hashing each piece right after its read; the payload's XXH3-64, or
    None when the file ends first."""
    hasher = xxhash.xxh3_64()
    piece = payload[:_PIECE_BYTES]
    if _preadv_all(fd, [head, piece], offset) < head.nbytes + piece.nbytes:
        return None
    hasher.update(piece)
    pos = piece.nbytes
    base = offset + head.nbytes
    while pos < payload.nbytes:
        piece = payload[pos : pos + _PIECE_BYTES]
        if _preadv_all(fd, [piece], base + pos) < piece.nbytes:
            return None
        hasher.update(piece)
        pos += piece.nbytes
    return hasher.intdigest()
