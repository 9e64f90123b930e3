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
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass

import numpy as np
import torch


@dataclass
class PagePoolStats:
    lent: int = 0  # pages handed out
    reused: int = 0  # of those, served from an idle buffer (no new memory touched)
    returned: int = 0  # pages whose last view was freed
    freed: int = 0  # of those, freed because the pool already held max_bytes idle


class PagePool:
    """Lends ``page_bytes``-sized uint8 CPU tensors, reusing the buffers of pages no longer
    referenced (see the module docstring for the ownership rule). Thread-safe."""

    def __init__(self, page_bytes: int, max_bytes: int) -> None:
        for name, v in (("page_bytes", page_bytes), ("max_bytes", max_bytes)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"{name} must be an int >= 0, got {v!r}")
        if page_bytes == 0:
            raise ValueError("page_bytes must be > 0")
        self.page_bytes = page_bytes
        self.max_bytes = max_bytes
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
        bufs.extend(np.empty(self.page_bytes, dtype=np.uint8) for _ in range(n - k))
        return [self._lend(buf) for buf in bufs]

    def idle_bytes(self) -> int:
        with self._lock:
            return len(self._idle) * self.page_bytes

    def clear(self) -> None:
        """Free every idle buffer (pages lent out are unaffected)."""
        with self._lock:
            self._idle.clear()

    def _lend(self, buf: np.ndarray) -> torch.Tensor:
        # A fresh array object over ``buf``'s memory: the tensor's storage holds it (and
        # nothing else does), so it dies exactly when the last view of the page does.
        lent = buf[:]
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


__all__ = ["PagePool", "PagePoolStats"]
