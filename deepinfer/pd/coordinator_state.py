"""The PD coordinator's state (`CoordinatorState`): every attribute `PDCoordinator` holds,
and the small helpers each of its layers uses (the pipe to a worker, live workers, failing).

`PDCoordinator` is layered over this class, one concept per module: ``request_outputs.py``
(what the caller receives for a request), ``worker_lifecycle.py`` (starting, stopping and
restarting worker processes), ``request_dispatch.py`` (sending requests to workers),
``message_relay.py`` (handling what workers send back) and ``coordinator.py`` (construction
and the batch API).
"""

from __future__ import annotations

import itertools
from multiprocessing.context import SpawnContext
from typing import Any

from deepinfer.engine.cache_setup import PrefixCacheConfig
from deepinfer.pd.config import PDConfig
from deepinfer.pd.messages import recv, send
from deepinfer.pd.state import RequestState, WorkerProc
from deepinfer.pd.worker import EngineBuilder
from deepinfer_sched.policies import LeastLoadedPairing
from deepinfer_sched.policies.base import PDPolicy, Router


class PDWorkerError(RuntimeError):
    """PD mode cannot serve: it is closed, no decode worker can be started, or no worker
    answered within the request timeout."""


class CoordinatorState:
    """The attributes of a `PDCoordinator` (set in its ``__init__``) and shared helpers."""

    config: PDConfig
    prefix_cache: PrefixCacheConfig | None
    router: Router
    pairing: LeastLoadedPairing
    pd_policy: PDPolicy
    _ids: itertools.count[int]
    _requests: dict[str, RequestState]
    _backlog: list[str]  # requests waiting for a live worker
    _failed: str | None
    _closed: bool
    _ctx: SpawnContext
    _build: EngineBuilder
    num_restarts: int  # workers started again after dying
    prefill: list[WorkerProc]
    decode: list[WorkerProc]

    @property
    def workers(self) -> list[WorkerProc]:
        return self.prefill + self.decode

    def _live(self, procs: list[WorkerProc]) -> list[WorkerProc]:
        return [p for p in procs if p.ready and not p.retired]

    def _send(self, proc: WorkerProc, message: dict[str, Any]) -> bool:
        """Send, or return False when the worker is gone (its death is handled by poll)."""
        try:
            send(proc.conn, message)
        except OSError:  # broken pipe: the worker is gone
            return False
        return True

    def _recv(self, proc: WorkerProc) -> dict[str, Any] | None:
        """The next message, or None when the worker closed its pipe."""
        try:
            return recv(proc.conn)
        except (EOFError, OSError):
            return None

    def _fail(self, reason: str) -> None:
        self._failed = reason
        raise PDWorkerError(reason)

    def _check_usable(self) -> None:
        if self._closed:
            raise PDWorkerError("the PD coordinator is closed")
        if self._failed is not None:
            raise PDWorkerError(f"PD mode is down: {self._failed}")
