"""`PDCoordinator`: owns the prefill and decode worker processes and routes every request.

Per request: the PD policy (``deepinfer_sched``'s `DisaggregatedPD` or `PerRequestPD`) decides
whether it prefills on a prefill worker (chosen by a ``deepinfer_sched`` router) or locally on
its decode worker; a prefilled request's KV is then paired to a decode worker by
`LeastLoadedPairing`. The coordinator relays JSON messages only; KV pages go from worker to
worker through shared memory. A worker that dies fails only the requests it had streamed from
(the others run again elsewhere) and is started again; silence longer than the request timeout
while work is outstanding raises `PDWorkerError` instead of hanging.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import multiprocessing as mp
import time
from collections.abc import Iterator
from dataclasses import replace
from multiprocessing.connection import wait
from typing import Any

from deepinfer.engine.cache_setup import PrefixCacheConfig
from deepinfer.engine.config import EngineConfig, SpeculativeConfig
from deepinfer.engine.outputs import RequestMetrics, RequestOutput
from deepinfer.engine.sampling_params import SamplingParams
from deepinfer.pd.config import PDConfig
from deepinfer.pd.decode_worker import decode_main
from deepinfer.pd.messages import recv, send
from deepinfer.pd.prefill_worker import prefill_main
from deepinfer.pd.routing import make_router, prompt_block_hashes, worker_cache_fields
from deepinfer.pd.state import RequestState, WorkerProc
from deepinfer.pd.transport import discard
from deepinfer.pd.views import PDRequestView, WorkerView
from deepinfer.pd.worker import EngineBuilder, WorkerSettings
from deepinfer_sched.policies import (
    DisaggregatedPD,
    LeastLoadedPairing,
    PerRequestPD,
)
from deepinfer_sched.policies.base import PDPolicy


class PDWorkerError(RuntimeError):
    """PD mode cannot serve: it is closed, no decode worker can be started, or no worker
    answered within the request timeout."""


# Times one request is sent again after the worker holding it died before it streamed.
MAX_REQUEST_RETRIES = 2


class PDCoordinator:
    """Run ``config.num_prefill_workers`` + ``config.num_decode_workers`` worker processes.

    A worker that dies (killed, crashed, or reporting a fatal error) costs only the requests it
    held: those that had not streamed a token yet are sent again to a live worker, the others
    finish with ``error`` set. The dead worker is started again in its slot; until it reports
    ready, requests go to the other workers (with no live prefill worker, prompts are
    prefilled on a decode worker; with no live decode worker, they wait for one).

    Example::

        engine_config = EngineConfig(num_blocks=256)
        with PDCoordinator(model_dir, engine_config=engine_config, build=build_worker_engine) as pd:
            rid, _ = pd.submit([1, 2, 3], SamplingParams(temperature=0, max_tokens=8), b"")
            final = [out for out in pd.run_until({rid}) if out.finished]
    """

    def __init__(
        self,
        model_dir: str,
        *,
        dtype: str = "float32",
        device: str = "cpu",
        engine_config: EngineConfig | None = None,
        config: PDConfig | None = None,
        prefix_cache: PrefixCacheConfig | None = None,
        speculative: SpeculativeConfig | None = None,
        build: EngineBuilder,
        cache_dir: str | None = None,
    ) -> None:
        """``build``: assembles each worker's engine from its settings, run inside the worker
        (``deepinfer.llm.build_worker_engine``; a module-level function, as spawn requires).
        ``model_dir``: what each worker loads (a model directory or ``.gguf`` file);
        ``cache_dir``: where they cache converted models.
        ``prefix_cache``: each prefill worker keeps a prefix cache with these tiers (a disk
        tier in its own ``...-pd-prefill-<i>`` directory: a directory has one writer); decode
        workers receive every page and keep none. ``speculative``: a `SpeculativeConfig` (an
        absolute checkpoint directory or ``"dspark"``); each decode worker loads the drafter it
        names and decodes with DSpark (a
        handed-off sequence first recomputes the drafter's context window, at most ``window``
        positions, as after a prefix-cache hit)."""
        if speculative is not None and not isinstance(speculative, SpeculativeConfig):
            raise TypeError(
                "speculative: PD workers load the drafter themselves; pass a "
                f"SpeculativeConfig, got {type(speculative).__name__}"
            )
        self.config = config or PDConfig()
        self.prefix_cache = prefix_cache
        cfg = self.config
        base = WorkerSettings(
            str(model_dir),
            dtype,
            device,
            dataclasses.asdict(engine_config or EngineConfig()),
            cfg.worker_threads,
            cache_dir=cache_dir or "",
        )
        self.router = make_router(cfg.router)
        self.pairing = LeastLoadedPairing()
        self.pd_policy: PDPolicy = (
            PerRequestPD(cfg.local_prefill_tokens)
            if cfg.policy == "per_request"
            else DisaggregatedPD()
        )
        self._ids = itertools.count()
        self._requests: dict[str, RequestState] = {}
        self._backlog: list[str] = []  # requests waiting for a live worker
        self._failed: str | None = None
        self._closed = False
        self._ctx = mp.get_context("spawn")
        self._build = build
        self.num_restarts = 0  # workers started again after dying
        self.prefill: list[WorkerProc] = []
        self.decode: list[WorkerProc] = []
        try:
            for i in range(cfg.num_prefill_workers):
                settings = base
                if prefix_cache is not None:
                    settings = replace(base, cache=worker_cache_fields(prefix_cache, i))
                self.prefill.append(self._start("prefill", i, settings.to_json()))
            for i in range(cfg.num_decode_workers):
                settings = base
                if speculative is not None:
                    settings = replace(base, speculative=speculative.to_dict())
                self.decode.append(self._start("decode", i, settings.to_json()))
            self._await_ready()
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------ lifecycle
    @property
    def workers(self) -> list[WorkerProc]:
        return self.prefill + self.decode

    def _start(self, role: str, index: int, settings_json: str) -> WorkerProc:
        parent, child = self._ctx.Pipe(duplex=True)
        target = prefill_main if role == "prefill" else decode_main
        proc = self._ctx.Process(
            target=target,
            args=(child, settings_json, self._build),
            daemon=True,
            name=f"deepinfer-pd-{role}-{index}",
        )
        proc.start()
        child.close()
        return WorkerProc(
            WorkerView(index, 1, 0, role),
            proc,
            parent,
            settings_json=settings_json,
            started_at=time.monotonic(),
        )

    def _await_ready(self) -> None:
        deadline = time.monotonic() + self.config.startup_timeout_s
        waiting = {id(p.conn): p for p in self.workers}
        while waiting:
            left = deadline - time.monotonic()
            if left <= 0:
                names = ", ".join(p.process.name for p in waiting.values())
                raise PDWorkerError(
                    f"PD workers did not start within {self.config.startup_timeout_s} s: {names}"
                )
            sentinels = {p.process.sentinel: p for p in waiting.values()}
            ready = wait([p.conn for p in waiting.values()] + list(sentinels), timeout=left)
            for obj in ready:
                if obj in sentinels and not sentinels[obj].conn.poll():
                    proc = sentinels[obj]
                    raise PDWorkerError(
                        f"{proc.process.name} exited during start-up "
                        f"(exit code {proc.process.exitcode})"
                    )
            for proc in list(waiting.values()):
                if not proc.conn.poll():
                    continue
                message = self._recv(proc)
                if message is None:
                    continue  # its sentinel reports the exit on the next pass
                if message["op"] == "fatal":
                    raise PDWorkerError(f"{proc.process.name} failed to start: {message['error']}")
                self._mark_ready(proc, message)
                del waiting[id(proc.conn)]

    def _mark_ready(self, proc: WorkerProc, message: dict[str, Any]) -> None:
        proc.view.block_size = int(message["block_size"])
        proc.view.kv_capacity_tokens = int(message["capacity_blocks"]) * int(message["block_size"])
        proc.view.hash_model = bytes.fromhex(str(message.get("hash_model", "")))
        proc.view.key_hash = str(message.get("key_hash", proc.view.key_hash))
        proc.ready = True
        proc.failed_starts = 0

    def close(self) -> None:
        """Stop every worker (politely, then by force) and unlink undelivered KV segments."""
        if self._closed:
            return
        self._closed = True
        for proc in self.workers:
            try:
                if proc.process.is_alive():
                    send(proc.conn, {"op": "shutdown"})
            except OSError:
                pass
        for proc in self.workers:
            proc.process.join(timeout=5.0)
            if proc.process.is_alive():
                proc.process.terminate()
                proc.process.join(timeout=5.0)
            proc.conn.close()
        for req in self._requests.values():
            if req.shm is not None:
                discard(req.shm)
        self._requests.clear()
        self._backlog.clear()

    def __enter__(self) -> PDCoordinator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ worker failures
    def _on_death(self, proc: WorkerProc, reason: str) -> list[RequestOutput]:
        """``proc`` is gone: fail or re-queue the requests it held, and start it again."""
        if proc.process.is_alive():  # a fatal report: make sure it is gone
            proc.process.kill()
        proc.process.join(timeout=5.0)
        proc.conn.close()
        name = proc.process.name
        outputs: list[RequestOutput] = []
        for rid, req in list(self._requests.items()):
            holds = req.decode is proc or (req.prefill is proc and req.decode is None)
            if not holds:
                continue
            if req.shm is not None:  # pages exported for it that nobody will import now
                discard(req.shm)
                req.shm = None
            proc.view.in_flight.pop(rid, None)
            if req.delivered == 0 and req.retries < MAX_REQUEST_RETRIES:
                # Nothing reached the caller: run it again elsewhere from the start.
                req.retries += 1
                req.prefill = req.decode = None
                req.handoff = None
                self._backlog.append(rid)
            else:
                outputs.append(
                    self._error_output(
                        rid,
                        req,
                        f"{name} died ({reason}) after {req.delivered} token(s) of this "
                        "request were streamed; send it again",
                    )
                )
        self._restart(proc)
        return outputs

    def _restart(self, dead: WorkerProc) -> None:
        role, index = dead.view.role, dead.view.instance_id
        slots = self.prefill if role == "prefill" else self.decode
        failed_starts = dead.failed_starts + (0 if dead.ready else 1)
        if failed_starts >= self.config.max_failed_starts:
            dead.retired = True
            dead.ready = False
            if not any(not p.retired for p in self.decode):
                self._fail(f"no decode worker can be started ({dead.process.name} failed)")
            return
        fresh = self._start(role, index, dead.settings_json)
        fresh.failed_starts = failed_starts
        slots[index] = fresh
        self.num_restarts += 1

    def _live(self, procs: list[WorkerProc]) -> list[WorkerProc]:
        return [p for p in procs if p.ready and not p.retired]

    # ------------------------------------------------------------------ requests
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

    def poll(self, timeout: float) -> list[RequestOutput]:
        """Wait up to ``timeout`` s for worker messages; return the user-facing outputs."""
        self._check_usable()
        self._drain_backlog()
        active = [p for p in self.workers if not p.retired]
        by_object: dict[Any, WorkerProc] = {p.conn: p for p in active}
        by_object.update({p.process.sentinel: p for p in active})
        outputs: list[RequestOutput] = []
        seen: set[int] = set()
        for obj in wait(list(by_object), timeout=timeout):
            proc = by_object[obj]
            if id(proc) in seen:
                continue
            seen.add(id(proc))
            death: str | None = None
            while death is None and proc.conn.poll():
                message = self._recv(proc)
                if message is None:
                    death = "its pipe closed"
                elif message["op"] == "fatal":
                    death = f"fatal error: {message['error']}"
                elif message["op"] == "ready":
                    self._mark_ready(proc, message)
                else:
                    out = self._handle(proc, message)
                    if out is not None:
                        outputs.append(out)
            if death is None and not proc.process.is_alive():
                death = f"exit code {proc.process.exitcode}"
            if death is None and not proc.ready:
                waited = time.monotonic() - proc.started_at
                if waited > self.config.startup_timeout_s:
                    death = f"not ready after {self.config.startup_timeout_s} s"
            if death is not None:
                outputs.extend(self._on_death(proc, death))
        self._check_startups()
        self._drain_backlog()
        return outputs

    def _check_startups(self) -> None:
        """Kill workers stuck in start-up beyond the start-up timeout (handled as deaths)."""
        now = time.monotonic()
        for proc in self.workers:
            if proc.retired or proc.ready or not proc.process.is_alive():
                continue
            if now - proc.started_at > self.config.startup_timeout_s:
                proc.process.kill()  # its sentinel fires on the next poll

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

    def _handle(self, proc: WorkerProc, message: dict[str, Any]) -> RequestOutput | None:
        op = message["op"]
        rid = str(message.get("request_id"))
        req = self._requests.get(rid)
        if req is None:
            if op == "prefilled":  # its request is gone (failed meanwhile): free the pages
                discard(message["kv"])
            return None
        if op == "error":
            return self._error_output(rid, req, str(message["error"]))
        if op == "prefilled":
            proc.view.in_flight.pop(rid, None)
            req.shm = message["kv"]
            req.metrics.num_cached_tokens = int(message.get("num_cached_tokens", 0))
            proc.view.remember(req.block_hashes)  # the worker stored the prompt's full blocks
            req.handoff = {
                "op": "decode",
                "request_id": rid,
                "prompt_ids": req.prompt_ids,
                "params": req.params.to_json_dict(),
                "namespace": req.namespace.hex(),
                "first_token": message["first_token"],
                "kv": message["kv"],
                "num_tokens": int(message["num_tokens"]),
            }
            self._dispatch(rid, req)
            return self._advance(
                rid, req, [int(message["first_token"])], str(message["first_text"]), None
            )
        if op == "output":
            if message["error"] is not None:
                return self._error_output(rid, req, str(message["error"]))
            req.shm = None  # a decode output means its pages were imported (and unlinked)
            steps, verified, accepted = (int(x) for x in message.get("spec", (0, 0, 0)))
            req.metrics.num_spec_steps = steps
            req.metrics.num_verified_drafts = verified
            req.metrics.num_accepted_drafts = accepted
            new = list(message["token_ids"])[req.delivered :]
            extra = str(message["text"])[len(req.text) :]
            reason = message["finish_reason"] if message["finished"] else None
            out = self._advance(rid, req, new, extra, reason)
            if out is not None and reason is not None:
                out.outputs[0].stop_reason = message.get("stop_reason")
            return out
        raise ValueError(f"unknown PD message op {op!r}")

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

    def _fail(self, reason: str) -> None:
        self._failed = reason
        raise PDWorkerError(reason)

    def _check_usable(self) -> None:
        if self._closed:
            raise PDWorkerError("the PD coordinator is closed")
        if self._failed is not None:
            raise PDWorkerError(f"PD mode is down: {self._failed}")

    # ------------------------------------------------------------------ batch API
    def run_until(self, rids: set[str]) -> Iterator[RequestOutput]:
        """Yield outputs until every request in ``rids`` finished; time out on silence."""
        last = time.monotonic()
        pending = set(rids) & set(self._requests)
        while pending:
            outs = self.poll(timeout=min(1.0, self.config.request_timeout_s))
            starting = any(not p.ready and not p.retired for p in self.workers)
            if outs or starting:  # a worker in start-up is bounded by the start-up timeout
                last = time.monotonic()
            elif time.monotonic() - last > self.config.request_timeout_s:
                self._fail(
                    f"no PD worker answered for {self.config.request_timeout_s} s "
                    f"with {len(pending)} request(s) outstanding"
                )
            for out in outs:
                if out.finished:
                    pending.discard(out.request_id)
                yield out
