"""A serving request's deltas to its caller, the accounting of a finished one, and aborting
one whose client went away (layer of `ServeService`, see ``service_state.py``)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from deepinfer.serve.request_stream import Delta, DeltaMaker, Tracked
from deepinfer.serve.service_state import ServiceState


class ServiceStreams(ServiceState):
    """Stream a request's deltas as its replica produces them."""

    def abort(self, tracked: Tracked) -> None:
        """Drop a request (its client left): the replica frees its KV blocks."""
        if not tracked.done:
            self._cancel(tracked)
            self.metrics.requests.labels("aborted").inc()

    async def stream(self, tracked: Tracked) -> AsyncIterator[Delta]:
        """The request's deltas as they come (one per completion step; with ``n > 1`` the
        completions interleave); the last has ``last``. Leaving the loop early (the client
        went away) aborts the request."""
        maker = DeltaMaker(tracked, self.metrics)
        finished = False
        try:
            while True:
                message = await tracked.queue.get()
                delta = maker.make(message)
                if delta.last:
                    finished = True
                    if delta.error is None:
                        self._account(tracked, message, delta.completion_tokens)
                    elif not tracked.done:
                        self._cancel(tracked)  # one completion failed: stop its siblings
                    yield delta
                    return
                if delta.text or delta.token_ids or delta.finished:
                    yield delta
        finally:
            if not finished:
                self.abort(tracked)

    def _account(self, tracked: Tracked, message: dict[str, Any], completion: int) -> None:
        m = self.metrics
        m.requests.labels("finished").inc()
        m.prompt_tokens.inc(len(tracked.prompt_ids))
        m.generation_tokens.inc(completion)
        steps, accepted = message.get("spec", [0, 0])
        if steps:
            m.accepted.observe(1.0 + accepted / steps)
