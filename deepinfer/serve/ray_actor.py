"""`ReplicaActor`: one serving replica as a Ray actor.

The actor runs the very replica loop a replica process runs (`replica_main`, in a thread of the
actor, on one end of an in-process pipe) and exposes the other end as actor methods: ``push``
delivers the front's JSON messages, ``poll`` long-polls the replica's (``state``, ``output``,
``prefilled`` ...). So the router-side protocol is unchanged; only its carrier is Ray.

Two things are added on the way out: the ``ready`` message names where the actor runs (node,
pid, an incarnation id that changes whenever Ray restarts the actor or the replica is
respawned), and a ``prefilled`` message gets the `ObjectRef` of its KV pages attached (see
`deepinfer.serve.ray_transport`). Messages the front meant for an earlier incarnation are
dropped, so a request queued just before a crash never runs twice.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing as mp
import os
import threading
import uuid
import warnings
from multiprocessing.connection import Connection
from typing import Any

import ray

from deepinfer.serve.ray_transport import ObjectStoreTransport
from deepinfer.serve.replica import replica_main

MAX_BATCH = 256  # messages per poll answer


class ReplicaActor:
    """The body of a replica actor (`ray_backend` applies ``ray.remote`` with its placement)."""

    def __init__(self, settings_json: str) -> None:
        # KV pages are scattered straight out of the read-only object-store buffer; torch warns
        # about read-only arrays although nothing writes to them.
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        self.settings_json = settings_json
        self.transport = ObjectStoreTransport()
        self.incarnation = ""
        self._conn: Connection | None = None
        self._thread: threading.Thread | None = None
        self._send_lock = threading.Lock()
        self._spawn()

    def _spawn(self) -> None:
        parent, child = mp.Pipe(duplex=True)
        transport = self.transport

        def body() -> None:
            try:
                replica_main(child, self.settings_json, set_threads=True, transport=transport)
            finally:
                with contextlib.suppress(OSError):
                    child.close()  # how the poller learns the replica ended

        self.incarnation = uuid.uuid4().hex[:12]
        self._conn = parent
        self._thread = threading.Thread(target=body, name="deepinfer-replica", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ actor methods
    def restart_replica(self) -> bool:
        """Start a fresh replica after the last one ended (fatal error) while the actor lived.
        (When the actor itself dies, Ray restarts it and ``__init__`` does this.)"""
        if self._thread is not None and self._thread.is_alive():
            return False
        self._spawn()
        return True

    def push(self, incarnation: str, texts: list[str], refs: list[Any]) -> bool:
        """Deliver the front's messages in order; ``refs[i]`` is ``(key, ObjectRef)`` for a
        ``decode`` message carrying KV pages. False if they were meant for another
        incarnation or the replica is gone."""
        conn = self._conn
        if conn is None or incarnation != self.incarnation:
            return False
        with self._send_lock:
            for text, ref in zip(texts, refs):
                if ref is not None:
                    key, obj = ref
                    self.transport.receive(str(key), obj)
                try:
                    conn.send_bytes(text.encode("utf-8"))
                except OSError:
                    return False
        return True

    def poll(self, timeout_s: float, incarnation: str = "") -> list[tuple[str, Any] | None] | str:
        """The replica's messages, waiting up to ``timeout_s`` for the first; a None item
        means the replica ended (nothing follows it). ``"stale"`` (nothing consumed) when the
        caller follows ``incarnation`` but this is another one: Ray restarted the actor between
        two polls, and the caller must treat the old one as dead before reading the new one."""
        if incarnation and incarnation != self.incarnation:
            return "stale"
        conn = self._conn
        if conn is None:
            return [None]
        out: list[tuple[str, Any] | None] = []
        wait = timeout_s
        try:
            while len(out) < MAX_BATCH and conn.poll(wait):
                out.append(self._outgoing(conn.recv_bytes()))
                wait = 0.0
        except (EOFError, OSError):
            self._conn = None
            out.append(None)
        return out

    def shutdown(self, timeout_s: float) -> bool:
        """Ask the replica to flush its cache and end; True if it ended within the timeout."""
        conn = self._conn
        if conn is not None:
            with self._send_lock, contextlib.suppress(OSError):
                conn.send_bytes(b'{"op":"shutdown"}')
        if self._thread is not None:
            self._thread.join(timeout_s)
            return not self._thread.is_alive()
        return True

    def where(self) -> dict[str, Any]:
        ctx = ray.get_runtime_context()
        return {
            "node_id": ctx.get_node_id(),
            "node_ip": ray.util.get_node_ip_address(),  # type: ignore[no-untyped-call]
            "pid": os.getpid(),
            "incarnation": self.incarnation,
            "kv_refs_held": self.transport.held(),
        }

    # ------------------------------------------------------------------ helpers
    def _outgoing(self, raw: bytes) -> tuple[str, Any]:
        text = raw.decode("utf-8")
        message = json.loads(text)
        if message.get("op") not in ("ready", "prefilled"):
            return text, None
        if message["op"] == "ready":
            message.update(self.where())
            return json.dumps(message, separators=(",", ":")), None
        kv = message.get("kv")
        ref = self.transport.take(str(kv.get("ray", ""))) if isinstance(kv, dict) else None
        return text, ref
