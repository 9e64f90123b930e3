"""Where deepinfer keeps files between runs, and the lock that lets processes share them.

``$DEEPINFER_CACHE_DIR`` (default ``~/.cache/deepinfer``) holds converted models
(``models/``), the prefix cache's disk tier (``kv/``) and compiled CPU kernels
(``kernels/``). Two processes filling the same entry take turns on a lock file, so the second
finds the first one's result instead of replacing it.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path


def cache_base() -> Path:
    """``$DEEPINFER_CACHE_DIR``, else ``~/.cache/deepinfer``."""
    env = os.environ.get("DEEPINFER_CACHE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "deepinfer"


@contextlib.contextmanager
def exclusive_lock(lock_file: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``lock_file`` (created if missing; a no-op where
    ``fcntl`` is absent)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        yield
        return
    with open(lock_file, "a+b") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)
