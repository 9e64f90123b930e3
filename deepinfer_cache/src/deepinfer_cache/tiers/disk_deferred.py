"""A ``DiskTier``'s deferred metadata work: deletes (file unlinks) and extended expiries
(file mtimes) are queued and run by a writer thread, ``flush`` or ``close``, so no caller
waits on the disk for them (layer of ``DiskTier``; see ``disk_state.py``)."""

from __future__ import annotations

import contextlib
import os

from .deferred_kick import DeferredKick
from .disk_state import DiskTierState


class DiskDeferred(DiskTierState, DeferredKick):
    """Queue deletes and expiry updates; run them off the caller's thread."""

    def touch(self, key: bytes, expires_at: float) -> None:
        """Persist an extended expiry cheaply: a block file's mtime holds its latest expiry
        (set at write time, moved here), and a restart uses ``max(header expiry, mtime)``.
        Deferred to a writer thread (never waits on the disk)."""
        if key in self._files or key in self._pending:
            with self._lock:
                self._touches[key] = max(expires_at, self._touches.get(key, 0.0))
            self._kick()

    def delete(self, key: bytes) -> None:
        with self._lock:
            pend = self._pending.pop(key, None)
            if pend is not None:
                self._used -= pend[2]
                return
            if key in self._files:
                self._forget(key)
                self._touches.pop(key, None)
                self._unlinks.append(key)
        self._kick()

    def _run_deferred(self) -> None:
        while True:
            with self._lock:
                self._kicked = False
                unlinks: list[str] = []
                while self._unlinks:
                    key = self._unlinks.popleft()
                    # Re-stored meanwhile: its new file replaces (or replaced) the old one.
                    if key not in self._files and key not in self._pending:
                        unlinks.append(self.path_of(key))
                # A block still being written keeps its touch until its file exists.
                touches = [(k, t) for k, t in self._touches.items() if k in self._files]
                for k, _ in touches:
                    del self._touches[k]
                self._touches = {k: t for k, t in self._touches.items() if k in self._pending}
            if not unlinks and not touches:
                return
            for path in unlinks:
                with contextlib.suppress(OSError):
                    os.unlink(path)
            for key, t in touches:
                with contextlib.suppress(OSError):
                    os.utime(self.path_of(key), (t, t))
