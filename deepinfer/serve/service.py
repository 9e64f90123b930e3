"""`ServeService`: the asynchronous engine behind the HTTP front.

It owns the replicas (each an engine in its own process, or thread), routes every request with
`deepinfer_sched`'s router over their live state, streams each request's tokens back through an
``asyncio.Queue`` as the replica produces them, aborts a request whose client went away (the
replica frees its KV), and handles faults: a replica whose pipe ends is marked down at once; its
requests that have not streamed a token are routed again, the others end with an error; the
replica is restarted and rejoins when it reports ready.

One concept per module: `ServeService` here holds construction over the layers of
``service_state.py``.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from typing import Any

from deepinfer.serve.config import ServeConfig
from deepinfer.serve.frontend import Frontend
from deepinfer.serve.metrics import ServeMetrics
from deepinfer.serve.replica_events import MAX_ATTEMPTS, RESTART_DELAYS_S
from deepinfer.serve.replica_handle import ReplicaHandle
from deepinfer.serve.request_stream import Tracked
from deepinfer.serve.routing import ReplicaRouter
from deepinfer.serve.service_lifecycle import ServiceLifecycle
from deepinfer.serve.service_streams import ServiceStreams
from deepinfer_sched.policies import LeastLoadedPairing

__all__ = ["MAX_ATTEMPTS", "RESTART_DELAYS_S", "ServeService"]


class ServeService(ServiceLifecycle, ServiceStreams):
    """Replicas + router + per-request streams. Use from one event loop.

    Example::

        service = ServeService(ServeConfig(replicas=2))
        await service.start()
        tracked = service.submit(prompt_ids, spec)
        async for delta in service.stream(tracked):
            print(delta.text, end="")
        await service.close()
    """

    def __init__(self, config: ServeConfig, frontend: Frontend | None = None) -> None:
        self.config = config
        self.frontend = frontend
        self.metrics = ServeMetrics()
        self.replicas: list[ReplicaHandle] = []
        self.router = ReplicaRouter(config.router, self._up_views, ttft_slo_s=config.ttft_slo_s)
        self._pairing = LeastLoadedPairing()
        self.draining = False
        self.closed = False
        self.created = int(time.time())
        self._tracked: dict[str, Tracked] = {}
        self._ids = itertools.count()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tier_hits: dict[int, dict[str, int]] = {}
        self._restart_handles: dict[int, asyncio.TimerHandle] = {}
        self._ray: Any = None  # a RayBackend with ``config.ray`` (its module imports Ray)
