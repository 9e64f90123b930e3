"""`ServeService`: the asynchronous engine behind the HTTP front.

It owns the replicas (each an engine in its own process, or thread), routes every request with
`deepinfer_sched`'s router over their live state, streams each request's tokens back through an
``asyncio.Queue`` as the replica produces them, aborts a request whose client went away (the
replica frees its KV), and handles faults: a replica whose pipe ends is marked down at once; its
requests that have not streamed a token are routed again, the others end with an error; the
replica is restarted and rejoins when it reports ready.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from deepinfer.engine.config import SpeculativeConfig
from deepinfer.pd.transport import discard
from deepinfer.serve.config import ServeConfig
from deepinfer.serve.errors import APIError, bad_request, overloaded, unavailable
from deepinfer.serve.frontend import Frontend, load_frontend
from deepinfer.serve.metrics import ServeMetrics
from deepinfer.serve.params import RequestSpec
from deepinfer.serve.replica import ReplicaSettings, replica_profile_path
from deepinfer.serve.replica_handle import ReplicaHandle, ReplicaStatus
from deepinfer.serve.replica_view import ReplicaView
from deepinfer.serve.request_stream import Delta, DeltaMaker, Tracked
from deepinfer.serve.routing import ReplicaRouter, RoutedRequest, prompt_hashes
from deepinfer_sched.policies import LeastLoadedPairing

MAX_ATTEMPTS = 3  # routings of one request (the first plus retries after replica deaths)
RESTART_DELAYS_S = (0.5, 2.0, 5.0, 15.0, 30.0)


class ServeService:
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

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        """Load the tokenizer, start every replica, wait until all report ready (or one fails
        to start: ``RuntimeError``)."""
        self._loop = asyncio.get_running_loop()
        cfg = self.config
        if self.frontend is None:
            self.frontend = await asyncio.to_thread(
                load_frontend, cfg.model, cfg.served_model_name, cfg.cache_dir
            )
        # Replicas load the model from its source, as `LLM` does: a GGUF file keeps its
        # quantized block formats (4-8x less memory and bandwidth than the converted copy the
        # front reads its tokenizer from).
        model = cfg.model
        if cfg.ray is not None:
            from deepinfer.serve.ray_backend import RayBackend  # Ray only with --ray

            self._ray = RayBackend.connect(cfg)
            await asyncio.to_thread(self._ray.wait_placed)
        for i in range(cfg.replicas):
            cache = None
            if cfg.prefix_cache is not None:
                cache = {
                    **dataclasses.asdict(cfg.prefix_cache),
                    "directory_suffix": f"-replica-{i}",
                }
            settings = ReplicaSettings(
                model=model,
                index=i,
                dtype=cfg.dtype,
                device=cfg.device,
                engine=dataclasses.asdict(cfg.engine),
                cache=cache,
                speculative=(
                    cfg.speculative.to_dict()
                    if isinstance(cfg.speculative, SpeculativeConfig)
                    else cfg.speculative or ""
                ),
                threads=cfg.threads_per_replica,
                cache_dir=cfg.cache_dir,
                profile_out=replica_profile_path(cfg.profile_out, i),
            )
            handle = (
                ReplicaHandle(settings, in_process=cfg.in_process)
                if self._ray is None
                else self._ray.handle(settings)
            )
            self.replicas.append(handle)
            self.metrics.up.labels(str(i)).set(0)
            handle.start(self._loop, self._on_message)
        deadline = time.monotonic() + cfg.startup_timeout_s
        while any(h.status is ReplicaStatus.STARTING for h in self.replicas):
            if time.monotonic() > deadline:
                raise RuntimeError(f"replicas did not start within {cfg.startup_timeout_s} s")
            await asyncio.sleep(0.05)
        failed = [h for h in self.replicas if h.status is not ReplicaStatus.UP]
        if failed:
            errors = "; ".join(f"replica {h.index}: {h.error}" for h in failed)
            await self.close()
            raise RuntimeError(f"replicas failed to start: {errors}")

    @property
    def model_name(self) -> str:
        assert self.frontend is not None
        return self.frontend.name

    def health(self) -> tuple[bool, dict[str, Any]]:
        up = [h for h in self.replicas if h.status is ReplicaStatus.UP]
        status = "draining" if self.draining else ("ok" if up else "starting")
        body = {
            "status": status,
            "replicas": [
                {
                    "index": h.index,
                    "role": self.role(h),
                    "status": h.status.value,
                    "pid": h.pid,
                    "restarts": h.restarts,
                    "num_waiting": h.view.num_waiting,
                    "num_running": h.view.num_running,
                    "free_blocks": h.view.free_blocks,
                    "capacity_blocks": h.view.capacity_blocks,
                    "cached_blocks": len(h.view.held),
                }
                for h in self.replicas
            ],
            "in_flight": len(self._tracked),
        }
        return status == "ok", body

    async def drain(self, timeout_s: float | None = None) -> int:
        """Refuse new requests; wait up to ``timeout_s`` for in-flight ones; abort the rest.
        Returns how many were aborted."""
        self.draining = True
        timeout = self.config.drain_timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + timeout
        while self._tracked and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        left = list(self._tracked.values())
        for t in left:
            self._fail(t, "the server is shutting down; the request was aborted")
        return len(left)

    async def close(self) -> None:
        """Stop every replica (each flushes its prefix cache's disk tier first)."""
        if self.closed:
            return
        self.closed = True
        self.draining = True
        for timer in self._restart_handles.values():
            timer.cancel()
        for t in list(self._tracked.values()):
            self._fail(t, "the server is shutting down")
        await asyncio.gather(
            *(asyncio.to_thread(h.stop, 30.0) for h in self.replicas), return_exceptions=True
        )
        if self._ray is not None:
            await asyncio.to_thread(self._ray.close)

    # ------------------------------------------------------------------ requests
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

    def abort(self, tracked: Tracked) -> None:
        """Drop a request (its client left): the replica frees its KV blocks."""
        if not tracked.done:
            self._cancel(tracked)
            self.metrics.requests.labels("aborted").inc()

    def _cancel(self, tracked: Tracked) -> None:
        tracked.done = True
        self._tracked.pop(tracked.request_id, None)
        if tracked.replica is not None:
            tracked.replica.send({"op": "abort", "request_id": tracked.request_id})
            tracked.replica.view.on_finished(tracked.request_id)

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

    # ------------------------------------------------------------------ replica messages
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
