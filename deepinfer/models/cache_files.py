"""Where deepinfer keeps files between runs, and the lock that lets processes share them.

``$DEEPINFER_CACHE_DIR`` (default ``~/.cache/deepinfer``) holds converted models
(``models/``), the prefix cache's disk tier (``kv/``) and compiled CPU kernels
(``kernels/``). Two processes filling the same entry take turns on a lock file, so the second
finds the first one's result instead of replacing it.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

# One lock for the whole cache directory: the kernels package builds its CPU kernels there too.
from deepinfer_kernels.cpu import exclusive_lock

__all__ = ["cache_base", "exclusive_lock", "file_sha256"]


def cache_base() -> Path:
    """``$DEEPINFER_CACHE_DIR``, else ``~/.cache/deepinfer``."""
    env = os.environ.get("DEEPINFER_CACHE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "deepinfer"


def file_sha256(path: Path) -> str:
    """The SHA-256 of ``path``'s bytes, hex (read in 4 MiB pieces): how a conversion records and
    checks the files it wrote."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()
