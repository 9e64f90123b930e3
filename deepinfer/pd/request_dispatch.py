"""Sending PD requests to workers: the PD policy's prefill-here-or-there choice, the router's
prefill worker, the pairing's decode worker, and a backlog while none is live (layer of
`PDCoordinator`, see ``coordinator_state.py``)."""

from __future__ import annotations

import json
import time

from deepinfer.engine.outputs import RequestMetrics, RequestOutput
from deepinfer.engine.sampling_params import SamplingParams
from deepinfer.pd.request_outputs import RequestOutputs
from deepinfer.pd.routing import prompt_block_hashes
from deepinfer.pd.state import RequestState, WorkerProc
from deepinfer.pd.views import PDRequestView


class RequestDispatch(RequestOutputs):
    """Route each request (or its prefilled hand-off) to a live worker."""

    def submit(
        self, prompt_ids: list[int], params: SamplingParams, namespace: bytes = b""
    ) -> tuple[str, RequestOutput | None]:
        """Route one request; returns its id, and an error output if it could not be sent."""
        self._check_usable()
        rid = f"pd-{next(self._ids)}"
        req = RequestState(
            list(prompt_ids),
            params,
            namespace,
            RequestMetrics(arrival_time=time.perf_counter(), num_prompt_tokens=len(prompt_ids)),
        )
        ready = next((p.view for p in self.prefill if p.ready), None)
        req.block_hashes = (
            prompt_block_hashes(
                prompt_ids,
                ready.block_size,
                namespace,
                model=ready.hash_model,
                key_hash=ready.key_hash,
            )
            if self.prefix_cache is not None and ready is not None and ready.block_size
            else ()
        )
        try:
            params.to_json_dict()
            json.dumps(req.prompt_ids)
        except (TypeError, ValueError) as exc:  # not JSON-serialisable prompt ids
            return rid, self._error_output(rid, req, str(exc))
        for name in ("logprobs", "prompt_logprobs"):
            if getattr(params, name) is not None:  # refused, not silently dropped
                error = f"{name}: not supported with pd (the workers do not send them back)"
                return rid, self._error_output(rid, req, error)
        self._requests[rid] = req
        self._dispatch(rid, req)
        return rid, None

    def _dispatch(self, rid: str, req: RequestState) -> None:
        """Send a request (or a prefilled request's hand-off) to a live worker, or keep it in
        the backlog until one is ready."""
        decoders = self._live(self.decode)
        if req.handoff is not None:
            if not decoders:
                self._backlog.append(rid)
                return
            req.decode = self._pair(
                PDRequestView(int(rid[3:]), len(req.prompt_ids), req.params.max_tokens),
                int(req.handoff["num_tokens"]),
            )
            message, req.handoff = req.handoff, None
            del message["num_tokens"]
            if not self._send(req.decode, message):
                req.handoff, req.decode = {**message, "num_tokens": len(req.prompt_ids)}, None
                self._backlog.append(rid)
                return
            req.decode.view.in_flight[rid] = len(req.prompt_ids)
            return
        body = {
            "request_id": rid,
            "prompt_ids": req.prompt_ids,
            "params": req.params.to_json_dict(),
            "namespace": req.namespace.hex(),
        }
        view = PDRequestView(
            int(rid[3:]),
            len(req.prompt_ids),
            req.params.max_tokens,
            req.namespace.hex(),
            0,
            req.block_hashes,
        )
        prefillers = self._live(self.prefill)
        # Decode workers keep no prefix cache: there the whole prompt is uncached. Without a
        # live prefill worker, prefilling there keeps the mode serving.
        local = self.pd_policy.prefill_on_decode(len(req.prompt_ids)) or not prefillers
        if local and not decoders:
            self._backlog.append(rid)
            return
        if local:
            target = req.decode = self._pair(view, len(req.prompt_ids))
            op = "generate"
        else:
            pick = self.router.route(view, [p.view for p in prefillers]).instance_id
            target = req.prefill = self.prefill[pick]
            op = "prefill"
        if not self._send(target, {"op": op, **body}):
            req.decode = req.prefill = None
            self._backlog.append(rid)  # its death is handled on the next poll
            return
        target.view.in_flight[rid] = len(req.prompt_ids)

    def _drain_backlog(self) -> None:
        backlog, self._backlog = self._backlog, []
        for rid in backlog:
            req = self._requests.get(rid)
            if req is not None:
                self._dispatch(rid, req)

    def _pair(self, view: PDRequestView, kv_tokens: int) -> WorkerProc:
        views = [p.view for p in self._live(self.decode)]
        chosen = self.pairing.pick(view, views, kv_tokens)
        if chosen is None:
            # Nobody has room right now: the decode worker queues it until blocks free up.
            chosen = min(views, key=lambda v: (v.kv_used_tokens, v.instance_id))
        return self.decode[chosen.instance_id]
