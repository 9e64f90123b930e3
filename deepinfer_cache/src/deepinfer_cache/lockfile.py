"""An advisory lock file that stops two processes from writing one cache directory.

``flock`` locks belong to the open file, so the kernel releases them when a holder dies,
even by SIGKILL: a crashed engine never leaves a stale lock behind.
"""

from __future__ import annotations

import errno
import fcntl
import os


class CacheLockedError(RuntimeError):
    """Another process (or another store in this process) holds the directory."""


class DirectoryLock:
    """Exclusive lock on ``<directory>/.lock``; use as a context manager or call ``release``."""

    def __init__(self, directory: str) -> None:
        self.path = os.path.join(directory, ".lock")
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
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
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        self._fd: int | None = fd

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> DirectoryLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
