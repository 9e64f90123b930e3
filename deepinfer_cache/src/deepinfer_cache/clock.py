"""Injectable clocks: the index and the store read time only through a ``Clock``."""

from __future__ import annotations

import threading
import time
from typing import Protocol, runtime_checkable


@runtime_checkable
class Clock(Protocol):
    """Wall-clock seconds since the epoch (expiry times survive restarts, so not monotonic)."""

    def now(self) -> float: ...


class SystemClock:
    """``time.time()``."""

    def now(self) -> float:
        return time.time()


class FakeClock:
    """A manually advanced clock for tests: ``clock.advance(3600)``."""

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self._t = float(start)
        self._lock = threading.Lock()

    def now(self) -> float:
        with self._lock:
            return self._t

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError(f"seconds must be >= 0, got {seconds}")
        with self._lock:
            self._t += seconds
