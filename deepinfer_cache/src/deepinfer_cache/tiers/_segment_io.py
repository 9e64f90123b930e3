"""Positional vectored writes for the segment tier (kept apart so tests can inject faults)."""

from __future__ import annotations

import os


def pwrite_all(fd: int, bufs: list[bytes | memoryview], offset: int) -> None:
    views = [memoryview(b).cast("B") for b in bufs]
    while views:
        n = os.pwritev(fd, views, offset)
        offset += n
        while views and n >= views[0].nbytes:
            n -= views[0].nbytes
            views.pop(0)
        if views and n:
            views[0] = views[0][n:]
