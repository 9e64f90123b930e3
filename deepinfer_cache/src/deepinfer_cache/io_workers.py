"""Background I/O threads fed by a bounded queue.

``submit`` blocks once ``queue_depth`` jobs are waiting (backpressure: a producer faster than
the disk slows down instead of growing memory without bound); ``submit(block=False)`` raises
``queue.Full`` instead so a caller can skip and count.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

_STOP = object()


class IOWorkers:
    def __init__(self, num_threads: int = 2, queue_depth: int = 64, name: str = "io") -> None:
        if num_threads < 1:
            raise ValueError(f"num_threads must be >= 1, got {num_threads}")
        if queue_depth < 1:
            raise ValueError(f"queue_depth must be >= 1, got {queue_depth}")
        self._q: queue.Queue[Any] = queue.Queue(maxsize=queue_depth)
        self._idle = threading.Condition()
        self._outstanding = 0
        self._closed = False
        self.blocked_submits = 0
        self._threads = [
            threading.Thread(target=self._run, name=f"deepinfer-cache-{name}-{i}", daemon=True)
            for i in range(num_threads)
        ]
        for t in self._threads:
            t.start()

    def submit(
        self, fn: Callable[..., Any], *args: Any, block: bool = True, timeout: float | None = None
    ) -> Future[Any]:
        if self._closed:
            raise RuntimeError("IOWorkers is shut down")
        fut: Future[Any] = Future()
        with self._idle:
            self._outstanding += 1
        item = (fut, fn, args)
        try:
            self._q.put_nowait(item)
        except queue.Full:
            if not block:
                self._done()
                raise
            self.blocked_submits += 1
            try:
                self._q.put(item, timeout=timeout)
            except queue.Full:
                self._done()
                raise
        return fut

    def queued(self) -> int:
        return self._q.qsize()

    def full(self) -> bool:
        """True while ``submit(block=False)`` would raise ``queue.Full``."""
        return self._q.full()

    def drain(self, timeout: float | None = None) -> bool:
        """Wait until every submitted job has finished; False on timeout."""
        with self._idle:
            return self._idle.wait_for(lambda: self._outstanding == 0, timeout)

    def shutdown(self, wait: bool = True) -> None:
        if self._closed:
            return
        if wait:
            self.drain()
        self._closed = True
        for _ in self._threads:
            self._q.put(_STOP)
        if wait:
            for t in self._threads:
                t.join()

    def _done(self) -> None:
        with self._idle:
            self._outstanding -= 1
            if self._outstanding == 0:
                self._idle.notify_all()

    def _run(self) -> None:
        while True:
            item = self._q.get()
            if item is _STOP:
                return
            fut, fn, args = item
            if fut.set_running_or_notify_cancel():
                try:
                    fut.set_result(fn(*args))
                except BaseException as exc:
                    fut.set_exception(exc)
            self._done()
