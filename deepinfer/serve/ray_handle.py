"""`RayReplicaHandle`: the front's handle on a replica that runs as a Ray actor.

It is a `ReplicaHandle` to the service (same ``start`` / ``send`` / ``stop`` / ``reap`` and the
same messages delivered on the event loop), carried by actor calls instead of a pipe:

- a reader thread long-polls ``actor.poll`` and hands each message to the loop; a failing call
  (the actor died: `RayActorError`) or the replica's end turns into ``{"op": "exit"}``, so the
  service drops the replica, retries or fails its requests and later calls ``start`` again;
- a writer thread sends the service's messages in order with ``actor.push`` (one call at a time,
  batched), tagged with the incarnation that announced itself ``ready``;
- ``start`` after a death reuses the actor while Ray restarts it (``max_restarts``): the poll
  waits for the new incarnation's ``ready``. Past ``max_restarts`` deaths it creates a new actor
  in the same placement-group bundle.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

import ray

from deepinfer.serve.replica import ReplicaSettings
from deepinfer.serve.replica_handle import OnMessage, ReplicaHandle, ReplicaStatus
from deepinfer.serve.replica_view import ReplicaView

POLL_S = 0.25  # longest wait of one poll call (a stopped handle's reader ends within it)


class _Ended(Exception):
    """The replica inside a live actor ended."""


class _Restarted(Exception):
    """Ray restarted the actor between two polls (its new incarnation waits to be read)."""


class RayReplicaHandle(ReplicaHandle):
    """One replica actor: its settings, the actor handle, its reader/writer threads."""

    def __init__(
        self,
        settings: ReplicaSettings,
        *,
        role: str,
        make_actor: Callable[[], Any],
        max_restarts: int,
    ) -> None:
        super().__init__(settings, in_process=False)
        self.role = role
        self.actor: Any = None
        self.deaths = 0  # deaths of the current actor (Ray restarts it up to max_restarts)
        self._make_actor = make_actor
        self._max_restarts = max_restarts
        self._respawn = False  # the replica ended inside a live actor
        self._incarnation = ""
        self._outbox: queue.SimpleQueue[dict[str, Any] | None] | None = None

    @property
    def pid(self) -> int | None:
        pid = self.info.get("pid")
        return None if pid is None else int(pid)

    def start(self, loop: asyncio.AbstractEventLoop, on_message: OnMessage) -> None:
        self.generation += 1
        gen = self.generation
        self.view = ReplicaView(self.index)
        self.status = ReplicaStatus.STARTING
        self.error = None
        self._incarnation = ""
        exhausted = self._max_restarts >= 0 and self.deaths > self._max_restarts
        if self.actor is None or exhausted:
            if self.actor is not None:
                with contextlib.suppress(Exception):
                    ray.kill(self.actor, no_restart=True)
            self.actor = self._make_actor()
            self.deaths = 0
            self._respawn = False
        respawn, self._respawn = self._respawn, False
        actor = self.actor
        outbox: queue.SimpleQueue[dict[str, Any] | None] = queue.SimpleQueue()
        self._outbox = outbox

        def deliver(message: dict[str, Any]) -> None:
            if gen == self.generation:
                on_message(self, message)

        def post(message: dict[str, Any]) -> None:
            with contextlib.suppress(RuntimeError):  # the loop may be closed at exit
                loop.call_soon_threadsafe(deliver, message)

        def reader() -> None:
            error = None
            try:
                if respawn:
                    ray.get(actor.restart_replica.remote())
                while gen == self.generation:
                    try:
                        batch = ray.get(actor.poll.remote(POLL_S, self._incarnation))
                    except ray.exceptions.ActorUnavailableError:
                        if self._incarnation:
                            raise  # it was up: this is a death
                        time.sleep(POLL_S)  # Ray is still restarting it: wait for ready
                        continue
                    if batch == "stale":
                        raise _Restarted
                    for item in batch:
                        if item is None:
                            raise _Ended
                        text, ref = item
                        message = json.loads(text)
                        if ref is not None:
                            message["kv"]["ref"] = ref  # travels with the decode message
                        elif message["op"] == "ready":
                            self._incarnation = str(message.get("incarnation", ""))
                        post(message)
            except _Ended:
                self._respawn = True  # it sent its own ``fatal`` before it ended
            except _Restarted:
                self.deaths += 1
                error = "its Ray actor died and was restarted"
            except ray.exceptions.RayActorError as exc:
                self.deaths += 1
                error = f"its Ray actor died ({type(exc).__name__})"
            except ray.exceptions.RayError as exc:
                self.deaths += 1
                error = f"Ray failed to reach its actor ({type(exc).__name__}: {exc})"
            if self._outbox is outbox:
                self._outbox = None
            outbox.put(None)
            if gen == self.generation:
                if error is not None:
                    post({"op": "fatal", "error": error})
                post({"op": "exit"})

        def writer() -> None:
            while True:
                first = outbox.get()
                batch = [first]
                with contextlib.suppress(queue.Empty):
                    while len(batch) < 256:
                        batch.append(outbox.get_nowait())
                texts: list[str] = []
                refs: list[Any] = []
                for message in batch:
                    if message is None:
                        continue
                    kv = message.get("kv")
                    ref = None
                    if isinstance(kv, dict) and "ref" in kv:
                        ref = (str(kv["ray"]), kv["ref"])
                        message = {**message, "kv": {k: v for k, v in kv.items() if k != "ref"}}
                    texts.append(json.dumps(message, separators=(",", ":")))
                    refs.append(ref)
                if texts:
                    # A failed push means the actor died: the reader reports it.
                    with contextlib.suppress(ray.exceptions.RayError):
                        ray.get(actor.push.remote(self._incarnation, texts, refs))
                if None in batch:
                    return

        name = f"deepinfer-replica-{self.index}"
        threading.Thread(target=reader, name=f"{name}-reader", daemon=True).start()
        threading.Thread(target=writer, name=f"{name}-writer", daemon=True).start()

    def send(self, message: dict[str, Any]) -> bool:
        """Queue a message for the actor; False if the replica is gone (its exit follows)."""
        outbox = self._outbox
        if outbox is None:
            return False
        outbox.put(message)
        return True

    def stop(self, timeout: float) -> None:
        """Let the replica flush its cache and end, then remove the actor for good."""
        self.status = ReplicaStatus.STOPPED
        self.generation += 1  # the reader stops within one poll; nothing more is delivered
        outbox, self._outbox = self._outbox, None
        if outbox is not None:
            outbox.put(None)
        actor, self.actor = self.actor, None
        if actor is None:
            return
        with contextlib.suppress(ray.exceptions.RayError):
            ray.get(actor.shutdown.remote(timeout), timeout=timeout + 5.0)
        with contextlib.suppress(Exception):
            ray.kill(actor, no_restart=True)

    def reap(self) -> None:
        """Nothing to release: Ray owns the actor's process and restarts it."""

    def kill(self, *, restart: bool = True) -> None:
        """Kill the actor as a crash would (tests, operators); Ray restarts it if allowed."""
        if self.actor is not None:
            ray.kill(self.actor, no_restart=not restart)
