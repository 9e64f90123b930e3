"""How ``SegmentDiskTier`` reads a request for many blocks: grouped into runs of consecutive
slots (``_runs``), runs that follow each other into streams (``_streams``, up to
``_STREAM_BYTES``), every stream read front to back by one thread through its own open file
descriptions, streams in parallel on the reader threads. ``segment_read.py`` reads each run.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Sequence
from concurrent.futures import Future
from typing import TYPE_CHECKING

import torch

from ..io_workers import IOWorkers
from ..segment_format import slot_offset
from ._locations import LocationTable
from .segment_read_descriptions import StreamDescriptions, _Descriptions

if TYPE_CHECKING:
    from .segment_write import _Segment

# A stream (adjacent runs read in order by one thread through one descriptor) ends after this
# many bytes, so that a large request is still read by several threads; each new stream's
# readahead starts small, so streams much shorter than this cost 4 KiB folios again.
_STREAM_BYTES = 64 << 20


class SegmentReadRequests(StreamDescriptions):
    """Mixin: the public reads of ``SegmentDiskTier`` and how a request is split into runs and
    streams (the attributes below are the tier's; ``_read_run`` is ``SegmentReads``')."""

    # The measured choice of ``segment_read.py``'s docstring; kept as an attribute so that
    # ``benchmarks/bench_cache_into.py`` can measure the alternative in the same process.
    _read_hint: str = "none"  # "willneed": announce every run with POSIX_FADV_WILLNEED
    # A stream's runs read by one ``_read_run`` (one C call, one header check); False reads
    # them run by run, as before session 16 (kept for ``bench_cache_into.py``'s A/B).
    _whole_streams: bool = True

    if TYPE_CHECKING:
        dtype: torch.dtype
        page_shape: tuple[int, ...]
        record_bytes: int
        max_read_slots: int
        _loc: LocationTable
        _segments: dict[int, _Segment]
        _readers: IOWorkers

        def _fd(self, s: _Segment) -> int: ...

        def _read_run(
            self,
            keys: Sequence[bytes],
            dest: Sequence[torch.Tensor] | None = None,
            fds: _Descriptions | None = None,
        ) -> list[torch.Tensor | None]: ...

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
