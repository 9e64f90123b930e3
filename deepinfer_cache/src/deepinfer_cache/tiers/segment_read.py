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
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
import time
from collections import deque
from collections.abc import Sequence
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import xxhash

from ..disk_format import CorruptBlockError
from ..io_workers import IOWorkers
from ..lockfile import DirectoryLock
from ..native_read import RecordReader, record_reader
from ..page_pool import PagePool
from ..segment_format import (
    RECORD_HEADER_BYTES,
    Geometry,
    check_record_parts,
    is_blank,
    slot_offset,
)
from ..segment_run_check import check_run_heads
from ._locations import LocationTable, Rec

_HOT_BYTES = 1 << 20  # bytes read per preadv before they are checked (fits a core's L2)
# A payload larger than _HOT_BYTES is read and hashed in pieces of this size (XXH3 streams):
# each piece is hashed while the kernel's copy of it is still in the core's 512 KiB L2,
# instead of the whole 2 MiB page after it has gone to L3.
_PIECE_BYTES = 256 << 10
# A stream (adjacent runs read in order by one thread through one descriptor) ends after this
# many bytes, so that a large request is still read by several threads; each new stream's
# readahead starts small, so streams much shorter than this cost 4 KiB folios again.
_STREAM_BYTES = 64 << 20
_SPARE_DESCRIPTIONS = 2  # idle descriptions kept per segment for later streams
# Bytes per O_DIRECT preadv (whole slots): on the development VM's virtio disk one 4-8 MiB
# request at a time read 2.1-2.6 GB/s, 2 MiB ones 1.5-2.3 (session 16, results/cache.md).
_DIRECT_BATCH_BYTES = 8 << 20
_DIRECT_ALIGN = 4096  # O_DIRECT: memory, offsets and lengths in whole logical blocks

if TYPE_CHECKING:
    from .segment_disk import SegmentCounters
    from .segment_write import _Segment


class SegmentReads:
    """Mixin: the reads of ``SegmentDiskTier`` (the attributes below are the tier's)."""

    # Both are the measured choices of the module docstring; kept as attributes so that
    # ``benchmarks/bench_cache_into.py`` can measure the alternatives in the same process.
    _read_hint: str = "none"  # "willneed": announce every run with POSIX_FADV_WILLNEED
    _own_readahead: bool = True  # each run reads through its own open file description
    _native_read: bool = True  # read and hash runs in C when it is available (native_read.py)
    # In C, read on a second thread while this one hashes. Off: loaded A/Bs (session 15,
    # results/cache.md) gave it more CPU (0.51-0.69 s/GB against 0.33-0.48: the reading
    # thread's copy lands in another core's cache) and a lower wall ratio (0.31-0.82 against
    # 0.22-1.93, medians 0.52 / 0.66); ``bench_cache_into.py`` keeps the A/B for a quiet run.
    _read_overlap: bool = False
    # A stream's runs read by one ``_read_run`` (one C call, one header check); False reads
    # them run by run, as before session 16 (kept for ``bench_cache_into.py``'s A/B).
    _whole_streams: bool = True
    # Each stream's own description is opened with ``POSIX_FADV_SEQUENTIAL`` (Linux: twice the
    # readahead window). Off: session 16's loaded A/B (results/cache.md) could not tell it
    # from plain reads; kept for the A/B. Applied when a description is opened.
    _sequential_hint: bool = False
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
        dtype: torch.dtype
        page_shape: tuple[int, ...]
        page_bytes: int
        record_bytes: int
        max_read_slots: int
        geometry: Geometry
        counters: SegmentCounters
        _lock: threading.Lock
        _pending: dict[bytes, tuple[int, torch.Tensor, int, int, Any]]
        _loc: LocationTable
        _segments: dict[int, _Segment]
        _invalid: list[tuple[int, int]]
        _changed: int
        _failed: deque[bytes]
        _quarantine: str
        _readers: IOWorkers
        _dirlock: DirectoryLock
        page_pool: PagePool

        def _fd(self, s: _Segment) -> int: ...

        def _release_fd(self, s: _Segment, user: bool = False) -> None: ...

        def _kick(self) -> None: ...

    def get(self, key: bytes) -> torch.Tensor | None:
        return self._read_run([key])[0]

    def get_async(self, key: bytes) -> Future[torch.Tensor | None]:
        return self._readers.submit(self.get, key)

    def get_many_async(self, keys: Sequence[bytes]) -> list[Future[torch.Tensor | None]]:
        """Read ``keys`` with few large reads: records in consecutive slots of one segment are
        read by one ``preadv`` (up to ``max_read_bytes``), streams in parallel on reader
        threads."""
        futs: list[Future[torch.Tensor | None]] = [Future() for _ in keys]
        for stream in self._streams(keys):
            job = self._readers.submit(self._read_stream, keys, stream, None)
            job.add_done_callback(functools.partial(_fan_out, stream=stream, futs=futs))
        return futs

    def get_many_into(self, keys: Sequence[bytes], out: torch.Tensor) -> list[bool]:
        """Read ``keys`` straight into ``out[i]`` (a CPU tensor ``[len(keys), *page_shape]`` of
        the tier's dtype, e.g. a reused pinned staging buffer): payloads land in ``out`` with
        no intermediate copy. Entry i is False when block i is missing or corrupt (``out[i]``
        is then unspecified)."""
        if not isinstance(out, torch.Tensor) or out.dtype != self.dtype:
            raise TypeError(f"out must be a {self.dtype} tensor")
        if tuple(out.shape) != (len(keys), *self.page_shape):
            raise ValueError(
                f"out must have shape {(len(keys), *self.page_shape)}, got {tuple(out.shape)}"
            )
        if out.device.type != "cpu" or not out.is_contiguous():
            raise ValueError("out must be a contiguous CPU tensor")
        rows = out.view(len(keys), -1).view(torch.uint8)
        ok = [False] * len(keys)
        for run, pages in self._read_runs(keys, [rows[i] for i in range(len(keys))]):
            for i, page in zip(run, pages):
                ok[i] = page is not None
        return ok

    def _read_runs(
        self, keys: Sequence[bytes], dest: Sequence[torch.Tensor] | None
    ) -> list[tuple[list[int], list[torch.Tensor | None]]]:
        """Every run of ``keys``: every stream but the first on the reader threads, the first in
        the calling thread meanwhile (a request that is one stream costs no thread hand-off,
        which on a busy machine waits for a time slice)."""
        streams = self._streams(keys)
        jobs = [self._readers.submit(self._read_stream, keys, st, dest) for st in streams[1:]]
        first = self._read_stream(keys, streams[0], dest) if streams else []
        got = [first, *(job.result() for job in jobs)]
        return [(run, pages) for st, res in zip(streams, got) for run, pages in zip(st, res)]

    def _read_stream(
        self,
        keys: Sequence[bytes],
        stream: list[list[int]],
        dest: Sequence[torch.Tensor] | None,
    ) -> list[list[torch.Tensor | None]]:
        """Read the runs of one stream in order, through one set of open file descriptions
        (``_Descriptions``), so the kernel sees one sequential reader."""
        fds = _Descriptions(self, self._own_readahead)
        try:
            if self._whole_streams and len(stream) > 1:
                # The runs of a stream are consecutive slots of one segment (``_streams``), so
                # one ``_read_run`` reads them all: one C call and one header check for the
                # stream instead of one per run (``_read_run`` still reads key by key should
                # the slots have changed since ``_streams`` looked).
                flat = [i for run in stream for i in run]
                pages = self._read_run(
                    [keys[i] for i in flat], None if dest is None else [dest[i] for i in flat], fds
                )
                split: list[list[torch.Tensor | None]] = []
                at = 0
                for run in stream:
                    split.append(pages[at : at + len(run)])
                    at += len(run)
                return split
            return [
                self._read_run(
                    [keys[i] for i in run], None if dest is None else [dest[i] for i in run], fds
                )
                for run in stream
            ]
        finally:
            fds.close()

    def _streams(self, keys: Sequence[bytes]) -> list[list[list[int]]]:
        """``_runs`` grouped into streams: runs that follow each other in one segment are one
        stream (up to ``_STREAM_BYTES``), read front to back by one thread; different streams
        are read in parallel."""
        with self._lock:
            where = {i: self._loc[k][:2] for i, k in enumerate(keys) if k in self._loc}
        most = max(1, _STREAM_BYTES // self.record_bytes)  # slots per stream
        streams: list[list[list[int]]] = []
        end = (-1, -1)  # (segment, slot after the last run of the current stream)
        slots = 0  # in the current stream
        for run in self._runs(keys):
            at = where.get(run[0])
            if at is not None and streams and at == end and slots + len(run) <= most:
                streams[-1].append(run)
                slots += len(run)
            else:
                streams.append([run])
                slots = len(run)
            end = (-1, -1) if at is None else (at[0], at[1] + len(run))
        return streams

    def _runs(self, keys: Sequence[bytes]) -> list[list[int]]:
        """Group key positions into runs of consecutive slots of one segment, in file order
        (pending and absent keys last, one run each)."""
        with self._lock:
            located = [
                (self._loc[k][0], self._loc[k][1], i) for i, k in enumerate(keys) if k in self._loc
            ]
        done = set()
        runs: list[list[int]] = []
        spans: list[list[int]] = []  # [segment, first slot, slots]
        last = (-1, -2)
        for sid, slot, i in sorted(located):
            if (
                runs
                and (sid, slot) == (last[0], last[1] + 1)
                and len(runs[-1]) < self.max_read_slots
            ):
                runs[-1].append(i)
                spans[-1][2] += 1
            else:
                runs.append([i])
                spans.append([sid, slot, 1])
            last = (sid, slot)
            done.add(i)
        runs.extend([i] for i in range(len(keys)) if i not in done)  # pending or absent
        if self._read_hint == "willneed":
            self._will_need(spans)
        return runs

    def _will_need(self, spans: list[list[int]]) -> None:
        """Start the reads of ``spans`` in the background (a hint: errors are ignored)."""
        sb = self.record_bytes
        for sid, slot, count in spans:
            seg = self._segments.get(sid)
            if seg is None:
                continue
            with contextlib.suppress(OSError):
                fd = self._fd(seg)
                os.posix_fadvise(fd, slot_offset(slot, sb), count * sb, os.POSIX_FADV_WILLNEED)

    def get_many(self, keys: Sequence[bytes]) -> list[torch.Tensor | None]:
        out: list[torch.Tensor | None] = [None] * len(keys)
        for run, pages in self._read_runs(keys, None):
            for i, page in zip(run, pages):
                out[i] = page
        return out

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


def _fan_out(
    job: Future[list[list[torch.Tensor | None]]],
    *,
    stream: list[list[int]],
    futs: list[Future[torch.Tensor | None]],
) -> None:
    exc = job.exception()
    for r, run in enumerate(stream):
        for j, i in enumerate(run):
            if exc is not None:
                futs[i].set_exception(exc)
            else:
                futs[i].set_result(job.result()[r][j])


def _direct_aligned(offset: int, slot_bytes: int, payloads: Sequence[int]) -> bool:
    """Whether whole slots from ``offset`` can be read with O_DIRECT into the frames that
    start ``RECORD_HEADER_BYTES`` before ``payloads``."""
    return (
        offset % _DIRECT_ALIGN == 0
        and slot_bytes % _DIRECT_ALIGN == 0
        and all((p - RECORD_HEADER_BYTES) % _DIRECT_ALIGN == 0 for p in payloads)
    )


class _Descriptions:
    """The open file descriptions one read stream uses, one per segment; handed back to the
    tier (kept idle for a later stream, or closed) when the stream ends.

    The kernel keeps readahead state per open file description: a stream read through its own
    is one sequential reader (a growing window of large folios) while other threads read
    other streams of the same segment; through the tier's shared descriptor their reads
    interleave and look random. With ``own`` False the shared descriptor is used."""

    __slots__ = ("_direct", "_fds", "_tier", "own")

    def __init__(self, tier: SegmentReads, own: bool) -> None:
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


def _preadv_all(fd: int, iov: list[memoryview], offset: int) -> int:
    """``preadv`` until every buffer is full or the file ends; returns bytes read."""
    views = [v.cast("B") for v in iov]
    got = 0
    while views:
        n = os.preadv(fd, views[:1024], offset + got)  # IOV_MAX
        if not n:
            break
        got += n
        while views and n >= views[0].nbytes:
            n -= views[0].nbytes
            views.pop(0)
        if views and n:
            views[0] = views[0][n:]
    return got
