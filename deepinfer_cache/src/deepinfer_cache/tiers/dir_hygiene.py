"""What both disk tiers do to a cache directory they open: odd entries are moved aside, never
fatal; leftovers of interrupted writes are removed; damaged files go to ``quarantine/``."""

from __future__ import annotations

import contextlib
import os
import time
from typing import Protocol


class HygieneCounters(Protocol):
    odd_entries_quarantined: int
    tmp_files_removed: int


def ensure_dir(path: str, counters: HygieneCounters) -> None:
    """Make ``path`` a real directory; anything else found there (a regular file, a symlink, a
    dangling or looping link) is moved aside."""
    if os.path.isdir(path) and not os.path.islink(path):
        return
    if os.path.lexists(path):
        counters.odd_entries_quarantined += 1
        os.replace(path, f"{path}.not-a-directory.{time.time_ns()}")
    os.makedirs(path, exist_ok=True)


def move_aside(quarantine: str, path: str, name: str) -> None:
    """Move ``path`` into ``quarantine`` (a timestamped ``name``), or delete it if it cannot
    be moved: it is never read again either way."""
    dest = os.path.join(quarantine, f"{name}.{time.time_ns()}")
    try:
        os.replace(path, dest)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(path)


def quarantine_odd(quarantine: str, path: str, name: str, counters: HygieneCounters) -> None:
    """Move an entry the tier did not write (a directory where a file belongs) aside."""
    counters.odd_entries_quarantined += 1
    with contextlib.suppress(OSError):
        os.replace(path, os.path.join(quarantine, f"{name}.odd.{time.time_ns()}"))


def clear_tmp(tmp: str, quarantine: str, counters: HygieneCounters) -> None:
    """Remove what interrupted writes left in ``tmp`` (directories there are moved aside)."""
    with os.scandir(tmp) as it:
        entries = list(it)
    for e in entries:
        try:
            if e.is_dir(follow_symlinks=False):
                quarantine_odd(quarantine, e.path, e.name, counters)
            else:
                os.unlink(e.path)
                counters.tmp_files_removed += 1
        except OSError:
            pass
