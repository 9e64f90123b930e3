"""The serving service's state (`ServiceState`): every attribute `ServeService` holds, and
the helpers each of its layers uses (a replica's role, the replicas up, failing or cancelling
a request).

`ServeService` is layered over this class, one concept per module: ``request_dispatch.py``
(routing a request to a replica, and a prefilled one to a decode replica),
``service_streams.py`` (a request's deltas to its caller), ``replica_events.py`` (what
replicas report: outputs, state, readiness, exits and restarts), ``service_lifecycle.py``
(start, health, drain, close) and ``service.py`` (construction).
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

from deepinfer.serve.config import ServeConfig
from deepinfer.serve.frontend import Frontend
from deepinfer.serve.metrics import ServeMetrics
from deepinfer.serve.replica_handle import ReplicaHandle, ReplicaStatus
from deepinfer.serve.request_stream import Tracked
from deepinfer.serve.routing import ReplicaRouter
from deepinfer_sched.policies import LeastLoadedPairing


class ServiceState:
    """The attributes of a `ServeService` (set in its ``__init__``) and shared helpers."""

    config: ServeConfig
    frontend: Frontend | None
    metrics: ServeMetrics
    replicas: list[ReplicaHandle]
    router: ReplicaRouter
    _pairing: LeastLoadedPairing
    draining: bool
    closed: bool
    created: int
    _tracked: dict[str, Tracked]
    _ids: itertools.count[int]
    _loop: asyncio.AbstractEventLoop | None
    _tier_hits: dict[int, dict[str, int]]
    _restart_handles: dict[int, asyncio.TimerHandle]
    _ray: Any  # a RayBackend with ``config.ray`` (its module imports Ray)

    def role(self, handle: ReplicaHandle) -> str:
        """``prefill`` / ``decode`` with ``--pd`` (the first P replicas prefill), else ``both``."""
        if self.config.pd is None:
            return "both"
        return "prefill" if handle.index < self.config.pd[0] else "decode"

    def _up(self, role: str) -> list[ReplicaHandle]:
        return [
            h
            for h in self.replicas
            if h.status is ReplicaStatus.UP and self.role(h) in (role, "both")
        ]

    def _up_views(self) -> list[Any]:
        return [h.view for h in self._up("prefill")]

    def _cancel(self, tracked: Tracked) -> None:
        tracked.done = True
        self._tracked.pop(tracked.request_id, None)
        if tracked.replica is not None:
            tracked.replica.send({"op": "abort", "request_id": tracked.request_id})
            tracked.replica.view.on_finished(tracked.request_id)

    def _fail(self, tracked: Tracked, error: str, status: int = 503) -> None:
        self._tracked.pop(tracked.request_id, None)
        replica = tracked.replica
        if replica is not None:
            if replica.status is ReplicaStatus.UP and not tracked.done:
                replica.send({"op": "abort", "request_id": tracked.request_id})
            replica.view.on_finished(tracked.request_id)
        if not tracked.done:
            tracked.done = True
            self.metrics.requests.labels("failed").inc()
            tracked.queue.put_nowait({"op": "error", "error": error, "status": status})
