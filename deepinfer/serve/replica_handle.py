"""The front's handle on one replica: start it (a process, or a thread in-process), send it
messages, and relay what it sends back onto the front's event loop.

A reader thread blocks on the pipe, so the HTTP event loop never waits on an engine; every
message (and the end of the pipe, which is how a dead replica shows) is handed to the loop with
``call_soon_threadsafe``. All replica state is then read and written on the loop only.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import multiprocessing as mp
import threading
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from deepinfer.pd.messages import recv, send
from deepinfer.serve.replica import ReplicaSettings, replica_main
from deepinfer.serve.replica_view import ReplicaView


class ReplicaStatus(enum.Enum):
    STARTING = "starting"
    UP = "up"
    DOWN = "down"
    STOPPED = "stopped"


OnMessage = Callable[["ReplicaHandle", dict[str, Any]], None]


class ReplicaHandle:
    """One replica: its settings, its process or thread, its pipe and its live view."""

    def __init__(self, settings: ReplicaSettings, *, in_process: bool) -> None:
        self.settings = settings
        self.index = settings.index
        self.in_process = in_process
        self.status = ReplicaStatus.STOPPED
        self.view = ReplicaView(settings.index)
        self.info: dict[str, Any] = {}
        self.error: str | None = None
        self.generation = 0  # bumped per start, so messages of a dead incarnation are dropped
        self.restarts = 0
        self._conn: Connection | None = None
        self._process: Any = None
        self._thread: threading.Thread | None = None

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    def start(self, loop: asyncio.AbstractEventLoop, on_message: OnMessage) -> None:
        """Start the replica; its messages arrive through ``on_message`` on ``loop``; its end
        arrives as ``{"op": "exit"}``."""
        self.generation += 1
        gen = self.generation
        self.view = ReplicaView(self.index)
        self.status = ReplicaStatus.STARTING
        self.error = None
        if self.in_process:
            parent, child = mp.Pipe(duplex=True)

            def body() -> None:
                replica_main(child, self.settings.to_json(), set_threads=False)

            self._thread = threading.Thread(
                target=body, name=f"deepinfer-replica-{self.index}", daemon=True
            )
            self._thread.start()
        else:
            ctx = mp.get_context("spawn")
            parent, child = ctx.Pipe(duplex=True)
            self._process = ctx.Process(
                target=replica_main,
                args=(child, self.settings.to_json()),
                name=f"deepinfer-replica-{self.index}",
                daemon=True,
            )
            self._process.start()
            child.close()  # only the replica holds it now, so its death reads as EOF here
        self._conn = parent

        def deliver(message: dict[str, Any]) -> None:
            if gen == self.generation:
                on_message(self, message)

        def reader() -> None:
            try:
                while True:
                    message = recv(parent)
                    loop.call_soon_threadsafe(deliver, message)
            except (EOFError, OSError, ValueError):
                pass
            with contextlib.suppress(RuntimeError):  # the loop may be closed at exit
                loop.call_soon_threadsafe(deliver, {"op": "exit"})

        threading.Thread(
            target=reader, name=f"deepinfer-replica-{self.index}-reader", daemon=True
        ).start()

    def send(self, message: dict[str, Any]) -> bool:
        """Send a message; False if the replica is gone (its exit message follows)."""
        conn = self._conn
        if conn is None:
            return False
        try:
            send(conn, message)
        except (OSError, ValueError):
            return False
        return True

    def stop(self, timeout: float) -> None:
        """Ask the replica to flush its cache and exit; wait up to ``timeout`` seconds."""
        self.send({"op": "shutdown"})
        if self._process is not None:
            self._process.join(timeout)
            if self._process.is_alive():
                self._process.kill()
                self._process.join(5.0)
        if self._thread is not None:
            self._thread.join(timeout)
        if self._conn is not None:
            with contextlib.suppress(OSError):
                self._conn.close()
        self._conn = None
        self.status = ReplicaStatus.STOPPED

    def reap(self) -> None:
        """Release what a dead replica left (its process object, its pipe)."""
        if self._process is not None:
            self._process.join(1.0)
            self._process = None
        if self._conn is not None:
            with contextlib.suppress(OSError):
                self._conn.close()
        self._conn = None
        self._thread = None
