"""``PagePool``: reused host memory for the pages a disk tier reads.

Why: a page read into freshly allocated memory pays a first-touch page fault and the kernel's
zeroing of every 4 KiB it covers (about 0.96 s of CPU per GB on the development VM, more than
the read itself). A pool lends out buffers that were touched before, as LMCache's host
allocator does, so a steady stream of reads costs no new pages.

Ownership rule: a page lent out belongs to the caller for as long as anything can still see
its memory (the tensor, any view or reshape of it, a numpy array made from it). Only when the
last of those is gone does its buffer go back to the pool; a buffer is therefore never
overwritten while someone holds it, and a caller never has to give pages back by hand. This
works because the tensor is made with ``torch.from_numpy``, whose storage keeps the lending
numpy array alive until the storage itself is freed; a ``weakref.finalize`` on that array
returns the buffer. Idle buffers beyond ``max_bytes`` are freed instead of kept.

Huge pages: new buffers are cut from one slab per ``take`` when the slab is at least 2 MiB
(``huge_pages``, default on): anonymous memory aligned to 2 MiB and advised
``MADV_HUGEPAGE``, so the kernel backs it with transparent huge pages even where THP is
"madvise" only. A page read then costs fewer TLB misses in the kernel's copy and in the hash
(measured, session 16: a cold raw read into 16 rotating 2 MiB buffers used 0.26 s of CPU per GB
with 4 KiB pages, 0.21 with huge ones; ``benchmarks/results/cache.md``). A slab's memory goes
back to the system when the last of its buffers is freed, so a page freed beyond ``max_bytes``
releases its memory only with its slab's siblings.

Frames: with ``frame_bytes`` each buffer is a frame of that many bytes and the page lent out
is its ``page_offset``.. ``page_offset + page_bytes`` part; frames are always cut from
page-aligned slabs, back to back. A disk tier reads a whole record slot (header, payload,
padding) into a frame with ``O_DIRECT``, which needs aligned memory, and lends the payload.
``max_bytes`` and ``idle_bytes`` count pages, not frames (a frame's extra bytes are a record's
header and padding: 4 KiB per 2 MiB page in a segment tier).
"""

from __future__ import annotations

import mmap
import threading
import weakref
from dataclasses import dataclass

import numpy as np
import torch

_HUGE_PAGE = 2 << 20  # x86-64 / arm64 (4 KiB base pages) PMD size


@dataclass
class PagePoolStats:
    lent: int = 0  # pages handed out
    reused: int = 0  # of those, served from an idle buffer (no new memory touched)
    returned: int = 0  # pages whose last view was freed
    freed: int = 0  # of those, freed because the pool already held max_bytes idle


class PagePool:
    """Lends ``page_bytes``-sized uint8 CPU tensors, reusing the buffers of pages no longer
    referenced (see the module docstring for the ownership rule). Thread-safe."""

    def __init__(
        self,
        page_bytes: int,
        max_bytes: int,
        *,
        huge_pages: bool = True,
        frame_bytes: int | None = None,
        page_offset: int = 0,
    ) -> None:
        for name, v in (
            ("page_bytes", page_bytes),
            ("max_bytes", max_bytes),
            ("page_offset", page_offset),
            ("frame_bytes", page_bytes if frame_bytes is None else frame_bytes),
        ):
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"{name} must be an int >= 0, got {v!r}")
        if page_bytes == 0:
            raise ValueError("page_bytes must be > 0")
        if not isinstance(huge_pages, bool):
            raise ValueError(f"huge_pages must be a bool, got {huge_pages!r}")
        if frame_bytes is not None and page_offset + page_bytes > frame_bytes:
            raise ValueError(
                f"frame_bytes ({frame_bytes}) must hold page_offset + page_bytes "
                f"({page_offset} + {page_bytes})"
            )
        if frame_bytes is None and page_offset:
            raise ValueError("page_offset needs frame_bytes")
        self.page_bytes = page_bytes
        self.max_bytes = max_bytes
        self.huge_pages = huge_pages
        self.frames = frame_bytes is not None
        self.frame_bytes = page_bytes if frame_bytes is None else frame_bytes
        self.page_offset = page_offset
        self.stats = PagePoolStats()
        self._idle: list[np.ndarray] = []
        # Re-entrant: a page can die inside ``take`` (a garbage collection run by one of its
        # allocations frees a cycle holding a page), and its finalizer then gives the buffer
        # back in the same thread while the lock is held.
        self._lock = threading.RLock()

    def take(self, n: int) -> list[torch.Tensor]:
        """``n`` pages (contiguous uint8 CPU tensors of ``page_bytes``), idle buffers first.
        Their contents are unspecified: the caller overwrites them."""
        with self._lock:
            k = min(n, len(self._idle))
            bufs = [self._idle.pop() for _ in range(k)]
            self.stats.lent += n
            self.stats.reused += k
        bufs.extend(self._new_buffers(n - k))
        return [self._lend(buf) for buf in bufs]

    def idle_bytes(self) -> int:
        with self._lock:
            return len(self._idle) * self.page_bytes

    def clear(self) -> None:
        """Free every idle buffer (pages lent out are unaffected)."""
        with self._lock:
            self._idle.clear()

    def _new_buffers(self, k: int) -> list[np.ndarray]:
        """``k`` new buffers: slices of one huge-page slab when it is at least a huge page,
        else separate arrays."""
        fb = self.frame_bytes
        if k == 0:
            return []
        if not self.frames and (not self.huge_pages or k * fb < _HUGE_PAGE):
            return [np.empty(fb, dtype=np.uint8) for _ in range(k)]
        slab = huge_page_slab(k * fb, huge=self.huge_pages)
        return [slab[i * fb : (i + 1) * fb] for i in range(k)]

    def _lend(self, buf: np.ndarray) -> torch.Tensor:
        # A fresh array object over ``buf``'s memory: the tensor's storage holds it (and
        # nothing else does), so it dies exactly when the last view of the page does.
        lent = buf[self.page_offset : self.page_offset + self.page_bytes]
        done = weakref.finalize(lent, self._give_back, buf)
        done.atexit = False  # at exit the memory goes with the process
        return torch.from_numpy(lent)

    def _give_back(self, buf: np.ndarray) -> None:
        # Runs in whichever thread freed the last view (possibly inside ``take``); takes only
        # this pool's lock.
        with self._lock:
            self.stats.returned += 1
            if (len(self._idle) + 1) * self.page_bytes <= self.max_bytes:
                self._idle.append(buf)
            else:
                self.stats.freed += 1


def huge_page_slab(nbytes: int, *, huge: bool = True) -> np.ndarray:
    """``nbytes`` of private anonymous memory starting on a 2 MiB boundary, advised
    ``MADV_HUGEPAGE`` (``huge``) where the platform has it (a hint: the kernel may still use
    4 KiB pages). The mapping is unmapped when the returned array and every view of it are
    gone."""
    if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes <= 0:
        raise ValueError(f"nbytes must be an int > 0, got {nbytes!r}")
    flags = getattr(mmap, "MAP_PRIVATE", 0) | getattr(mmap, "MAP_ANONYMOUS", 0)
    # One huge page more than asked for, so that an aligned start always fits.
    mapping = mmap.mmap(-1, nbytes + _HUGE_PAGE, flags=flags) if flags else None
    if mapping is None:  # no MAP_ANONYMOUS: plain memory
        return np.empty(nbytes, dtype=np.uint8)
    whole = np.frombuffer(mapping, dtype=np.uint8)  # holds ``mapping`` open while alive
    start = -whole.ctypes.data % _HUGE_PAGE
    if huge and hasattr(mmap, "MADV_HUGEPAGE"):
        mapping.madvise(mmap.MADV_HUGEPAGE, start, nbytes)
    return whole[start : start + nbytes]


__all__ = ["PagePool", "PagePoolStats", "huge_page_slab"]
