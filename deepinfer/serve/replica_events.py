"""What the replicas report to the serving service: outputs, load state, prefilled KV,
rejections, readiness, and exits, after which a replica's requests are routed again or failed
and the replica is restarted (layer of `ServeService`, see ``service_state.py``)."""

from __future__ import annotations

from typing import Any

from deepinfer.pd.transport import discard
from deepinfer.serve.errors import APIError
from deepinfer.serve.replica_handle import ReplicaHandle, ReplicaStatus
from deepinfer.serve.request_dispatch import RequestDispatch

MAX_ATTEMPTS = 3  # routings of one request (the first plus retries after replica deaths)
RESTART_DELAYS_S = (0.5, 2.0, 5.0, 15.0, 30.0)


class ReplicaEvents(RequestDispatch):
    """Handle each replica message on the event loop."""

    def _on_message(self, handle: ReplicaHandle, message: dict[str, Any]) -> None:
        op = message["op"]
        if op == "output":
            tracked = self._tracked.get(str(message["request_id"]))
            if tracked is None or tracked.replica is not handle:
                return  # aborted, or the answer of a replica it was moved away from
            if tracked.on_output(message):
                self._tracked.pop(tracked.request_id, None)
                tracked.done = True
                handle.view.on_finished(tracked.request_id)
            tracked.queue.put_nowait(message)
        elif op == "state":
            handle.view.on_state(message)
            label = str(handle.index)
            self.metrics.waiting.labels(label).set(handle.view.num_waiting)
            self.metrics.running.labels(label).set(handle.view.num_running)
            self.metrics.kv_free.labels(label).set(handle.view.free_blocks)
            seen = self._tier_hits.setdefault(handle.index, {})
            for tier, total in message.get("tier_hits", {}).items():
                delta = int(total) - seen.get(tier, 0)
                if delta > 0:
                    self.metrics.prefix_hit_tokens.labels(tier).inc(delta)
                seen[tier] = int(total)
        elif op == "prefilled":
            self._hand_off(handle, message)
        elif op == "rejected":
            tracked = self._tracked.get(str(message["request_id"]))
            if tracked is not None and tracked.replica is handle:
                self._fail(tracked, str(message["error"]), 400)
        elif op == "ready":
            handle.info = dict(message)
            handle.view.on_ready(message)
            handle.status = ReplicaStatus.UP
            self._tier_hits.pop(handle.index, None)
            self.metrics.up.labels(str(handle.index)).set(1)
        elif op == "fatal":
            handle.error = str(message.get("error"))
        elif op == "exit":
            self._on_exit(handle)

    def _on_exit(self, handle: ReplicaHandle) -> None:
        if handle.status is ReplicaStatus.STOPPED:
            return
        was_up = handle.status is ReplicaStatus.UP
        handle.status = ReplicaStatus.DOWN
        handle.error = handle.error or "the replica process ended"
        handle.reap()
        self.metrics.up.labels(str(handle.index)).set(0)
        for tracked in [t for t in self._tracked.values() if t.replica is handle]:
            self._tracked.pop(tracked.request_id, None)
            if tracked.kv is not None:
                discard(tracked.kv)  # pages in transit to the dead replica, if not imported
            if tracked.streamed == 0 and tracked.attempts < MAX_ATTEMPTS and not self.closed:
                try:
                    self._dispatch(tracked, admit=False)
                    self.metrics.retried.inc()
                    continue
                except APIError:
                    pass
            self._fail(
                tracked,
                f"replica {handle.index} failed ({handle.error}) after the request had "
                f"streamed {tracked.streamed} tokens; its output is incomplete"
                if tracked.streamed
                else f"replica {handle.index} failed ({handle.error}) and no other replica "
                "could take the request",
            )
        if self.config.restart and not self.closed and (was_up or handle.restarts):
            delay = RESTART_DELAYS_S[min(handle.restarts, len(RESTART_DELAYS_S) - 1)]
            assert self._loop is not None
            self._restart_handles[handle.index] = self._loop.call_later(
                delay, self._restart, handle
            )

    def _restart(self, handle: ReplicaHandle) -> None:
        self._restart_handles.pop(handle.index, None)
        if self.closed or handle.status is not ReplicaStatus.DOWN:
            return
        handle.restarts += 1
        self.metrics.restarts.labels(str(handle.index)).inc()
        assert self._loop is not None
        handle.start(self._loop, self._on_message)
