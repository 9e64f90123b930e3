"""Positional vectored writes and reads for the segment tier (kept apart so tests can inject
faults)."""

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


def preadv_all(fd: int, iov: list[memoryview], offset: int) -> int:
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
