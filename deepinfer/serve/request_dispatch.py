"""Routing a serving request: checks on admission, the router's replica (a prefill replica
with ``--pd``), and the hand-off of a prefilled request's KV to a decode replica (layer of
`ServeService`, see ``service_state.py``)."""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid
from typing import Any

from deepinfer.pd.transport import discard
from deepinfer.serve.errors import bad_request, overloaded, unavailable
from deepinfer.serve.params import RequestSpec
from deepinfer.serve.replica_handle import ReplicaHandle, ReplicaStatus
from deepinfer.serve.replica_view import ReplicaView
from deepinfer.serve.request_stream import Tracked
from deepinfer.serve.routing import RoutedRequest, prompt_hashes
from deepinfer.serve.service_state import ServiceState


class RequestDispatch(ServiceState):
    """Send each request to a replica, or refuse it with an `APIError`."""

    def max_model_len(self) -> int | None:
        for h in self.replicas:
            if "max_model_len" in h.info:
                return int(h.info["max_model_len"])
        return None

    def submit(self, prompt_ids: list[int], spec: RequestSpec, *, param: str = "prompt") -> Tracked:
        """Route and queue a request; raise `APIError` (400 / 429 / 503) if it cannot be."""
        if self.draining:
            raise unavailable("the server is draining and accepts no new requests")
        limit = self.max_model_len()
        if limit is not None and len(prompt_ids) >= limit:
            raise bad_request(
                f"the prompt has {len(prompt_ids)} tokens; the context window holds {limit} "
                "and at least one token must be left to generate",
                param,
            )
        if not prompt_ids:
            raise bad_request("the prompt is empty", param)
        if self.config.pd is not None and spec.candidates > 1:
            # A prefill replica hands one KV copy to one decode request.
            raise bad_request("n > 1 and best_of > 1 are not supported with --pd yet", "n")
        if not [h for h in self.replicas if h.status is ReplicaStatus.UP]:
            raise unavailable("no replica is up yet")
        rid = f"{uuid.uuid4().hex[:24]}"
        tracked = Tracked(
            request_id=rid,
            prompt_ids=prompt_ids,
            spec=spec,
            routed=RoutedRequest(
                request_id=next(self._ids),
                input_len=len(prompt_ids),
                output_len=spec.params.max_tokens,
                block_hashes=(),
                tenant=spec.namespace.decode("utf-8", "replace"),
            ),
            queue=asyncio.Queue(),
            arrival=time.perf_counter(),
        )
        self._dispatch(tracked, admit=True)
        return tracked

    def _dispatch(self, tracked: Tracked, *, admit: bool) -> None:
        """Pick a replica for ``tracked`` and send it there; raise `APIError` if none can.
        With ``--pd`` that is a prefill replica; ``_hand_off`` pairs a decode one later."""
        up = self._up("prefill")
        if not up or (self.config.pd is not None and not self._up("decode")):
            raise unavailable("no replica is up")
        bs = up[0].view.block_size
        if not tracked.routed.block_hashes and tracked.prompt_ids:
            tracked.routed = dataclasses.replace(
                tracked.routed,
                block_hashes=prompt_hashes(
                    tracked.prompt_ids,
                    bs,
                    tracked.spec.namespace,
                    up[0].view.hash_model,
                    key_hash=up[0].view.key_hash,
                ),
            )
        views = [h.view for h in up]
        chosen_view = self.router.route(tracked.routed, views)
        handle = up[views.index(chosen_view)]
        if admit:
            if (
                self.config.max_waiting is not None
                and chosen_view.num_waiting >= self.config.max_waiting
            ):
                raise overloaded(
                    f"replica {handle.index} already queues {chosen_view.num_waiting} requests"
                )
            reason = self.router.admit(tracked.routed, chosen_view, time.monotonic())
            if reason is not None:
                raise overloaded(f"{reason} (TTFT SLO {self.config.ttft_slo_s} s)")
        hashes = tracked.routed.block_hashes
        cached = chosen_view.cached_prefix_blocks(hashes) * bs
        tracked.replica = handle
        tracked.kv = None
        tracked.attempts += 1
        self._tracked[tracked.request_id] = tracked
        chosen_view.on_routed(tracked.request_id, hashes, len(tracked.prompt_ids) - cached)
        self.metrics.routed.labels(str(handle.index)).inc()
        sent = handle.send(
            {
                "op": "add" if self.config.pd is None else "prefill",
                "request_id": tracked.request_id,
                "prompt_ids": tracked.prompt_ids,
                "params": tracked.spec.params.to_json_dict(),
                "namespace": tracked.spec.namespace.hex(),
                # when the front let go of it (a live profile splits the front's overhead
                # from the replica's queueing with it; perf_counter is machine-wide)
                "sent_s": time.perf_counter(),
            }
        )
        if not sent:
            # The pipe is gone: its exit message retries or fails this request shortly.
            return

    def _hand_off(self, prefill: ReplicaHandle, message: dict[str, Any]) -> None:
        """A prefill replica exported a request's KV: pair a decode replica
        (`LeastLoadedPairing`, or the least loaded when none has room yet: it queues the
        transfer until blocks free up) and send the pages there."""
        tracked = self._tracked.get(str(message["request_id"]))
        if tracked is None or tracked.replica is not prefill:
            discard(message["kv"])  # aborted meanwhile
            return
        prefill.view.on_finished(tracked.request_id)
        decodes = self._up("decode")
        if not decodes:
            discard(message["kv"])
            self._fail(tracked, "no decode replica is up")
            return
        views = [h.view for h in decodes]
        kv_tokens = len(tracked.prompt_ids) + 1
        picked = self._pairing.pick(tracked.routed, views, kv_tokens)
        view = (
            picked
            if isinstance(picked, ReplicaView)
            else min(views, key=lambda v: (v.num_waiting + v.num_running, v.kv_used_tokens))
        )
        handle = decodes[views.index(view)]
        tracked.replica = handle
        tracked.kv = message["kv"]
        tracked.cached_tokens = int(message.get("cached_tokens", 0))
        tracked.first_logprobs = message.get("first_logprobs")
        view.on_routed(tracked.request_id, (), 0)
        handle.send(
            {
                "op": "decode",
                "request_id": tracked.request_id,
                "prompt_ids": tracked.prompt_ids,
                "first_token": int(message["first_token"]),
                "params": tracked.spec.params.to_json_dict(),
                "namespace": tracked.spec.namespace.hex(),
                "kv": message["kv"],
            }
        )
