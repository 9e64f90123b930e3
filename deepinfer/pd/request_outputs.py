"""What the caller receives for a PD request: its streamed outputs and its final error, and
forgetting a finished request (layer of `PDCoordinator`, see ``coordinator_state.py``)."""

from __future__ import annotations

import time

from deepinfer.engine.outputs import RequestOutput
from deepinfer.pd.coordinator_state import CoordinatorState
from deepinfer.pd.state import RequestState


class RequestOutputs(CoordinatorState):
    """Build a request's outputs from the tokens and text it has received."""

    def _advance(
        self, rid: str, req: RequestState, new: list[int], new_text: str, reason: str | None
    ) -> RequestOutput | None:
        if not new and reason is None:
            return None
        now = time.perf_counter()
        if req.metrics.first_token_time is None and new:
            req.metrics.first_token_time = now
        req.token_ids.extend(new)
        req.delivered = len(req.token_ids)
        req.text += new_text
        if reason is not None:
            req.metrics.finish_time = now
            self._forget(rid, req)
        return RequestOutput(
            request_id=rid,
            prompt_token_ids=req.prompt_ids,
            token_ids=list(req.token_ids),
            text=req.text,
            new_token_ids=new,
            new_text=new_text,
            finished=reason is not None,
            finish_reason=reason,
            metrics=req.metrics,
        )

    def _error_output(self, rid: str, req: RequestState, error: str) -> RequestOutput:
        req.metrics.finish_time = time.perf_counter()
        self._forget(rid, req)
        return RequestOutput(
            request_id=rid,
            prompt_token_ids=[t for t in req.prompt_ids if isinstance(t, int)],
            token_ids=list(req.token_ids),
            text=req.text,
            finished=True,
            finish_reason="error",
            error=error,
            metrics=req.metrics,
        )

    def _forget(self, rid: str, req: RequestState) -> None:
        self._requests.pop(rid, None)
        for proc in (req.prefill, req.decode):
            if proc is not None:
                proc.view.in_flight.pop(rid, None)
