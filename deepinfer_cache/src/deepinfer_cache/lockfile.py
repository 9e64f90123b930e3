"""An advisory lock file that stops two processes from writing one cache directory.

The lock is an ``flock`` on ``<directory>/.lock``. ``flock`` locks belong to the open file
description, so:

* the kernel releases them when the holder dies, even by SIGKILL: a crashed engine never
  leaves a stale lock behind;
* a second open in the same process conflicts like one in another process;
* the descriptor is opened ``O_CLOEXEC`` (a program started with ``exec`` never inherits it), and
  a child made by ``os.fork()`` without ``exec`` closes its copy at once (an
  ``os.register_at_fork`` hook), so the lock is tied to the opening process and is released
  when that process ends, whatever children it left running. The child only closes its
  descriptor; it never unlocks (that would release the parent's lock too).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import weakref


class CacheLockedError(RuntimeError):
    """Another process (or another store in this process) holds the directory."""


def _close_in_child(ref: weakref.ref[DirectoryLock]) -> None:
    lock = ref()
    if lock is not None:
        lock._forget_in_child()


class DirectoryLock:
    """Exclusive lock on ``<directory>/.lock``; use as a context manager or call ``release``."""

    def __init__(self, directory: str) -> None:
        self.path = os.path.join(directory, ".lock")
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip()
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EACCES):
                raise CacheLockedError(
                    f"cache directory {directory!r} is locked by another writer (pid {holder or '?'})"
                ) from None
            raise
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, str(os.getpid()).encode(), 0)
        except OSError:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)
            raise
        self._fd: int | None = fd
        self._pid = os.getpid()
        ref = weakref.ref(self)
        os.register_at_fork(after_in_child=lambda: _close_in_child(ref))

    @property
    def held(self) -> bool:
        return self._fd is not None and self._pid == os.getpid()

    def release(self) -> None:
        if self._fd is not None:
            if self._pid == os.getpid():
                fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    def _forget_in_child(self) -> None:
        # Close without unlocking: the lock is shared with the parent's descriptor.
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None

    def __enter__(self) -> DirectoryLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
