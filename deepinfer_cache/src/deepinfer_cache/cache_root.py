"""Where deepinfer_cache keeps its files unless told otherwise (the KV directory, built helpers)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """``$DEEPINFER_CACHE_DIR``, else ``~/.cache/deepinfer`` (read at each call, so a test's or
    a worker's environment applies)."""
    env = os.environ.get("DEEPINFER_CACHE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "deepinfer"
