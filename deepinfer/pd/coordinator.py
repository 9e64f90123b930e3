"""`PDCoordinator`: owns the prefill and decode worker processes and routes every request.

Per request: the PD policy (``deepinfer_sched``'s `DisaggregatedPD` or `PerRequestPD`) decides
whether it prefills on a prefill worker (chosen by a ``deepinfer_sched`` router) or locally on
its decode worker; a prefilled request's KV is then paired to a decode worker by
`LeastLoadedPairing`. The coordinator relays JSON messages only; KV pages go from worker to
worker through shared memory. A worker that dies, or silence longer than the request timeout
while work is outstanding, raises `PDWorkerError` instead of hanging.
"""

from __future__ import annotations

import dataclasses
import itertools
import multiprocessing as mp
import time
from collections.abc import Iterator
from collections.abc import Sequence as Seq
from dataclasses import replace
from multiprocessing.connection import wait
from typing import Any

from deepinfer.engine.cache_setup import PrefixCacheConfig
from deepinfer.engine.config import EngineConfig
from deepinfer.engine.outputs import RequestMetrics, RequestOutput
from deepinfer.engine.sampling_params import SamplingParams
from deepinfer.pd.config import PDConfig
from deepinfer.pd.decode_worker import decode_main
from deepinfer.pd.messages import params_to_json, recv, send
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
    """A PD worker process failed (crashed, failed to start, or stopped answering)."""


class PDCoordinator:
    """Run ``config.num_prefill_workers`` + ``config.num_decode_workers`` worker processes.

    Example::

        engine_config = EngineConfig(num_blocks=256)
        with PDCoordinator(model_dir, engine_config=engine_config, build=build_worker_engine) as pd:
            outs = pd.generate([[1, 2, 3]], [SamplingParams(temperature=0, max_tokens=8)])
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
        speculative: str | None = None,
        build: EngineBuilder,
    ) -> None:
        """``build``: assembles each worker's engine from its settings, run inside the worker
        (``deepinfer.llm.build_worker_engine``; a module-level function, as spawn requires).
        ``prefix_cache``: each prefill worker keeps a prefix cache with these tiers (a disk
        tier in its own ``...-pd-prefill-<i>`` directory: a directory has one writer); decode
        workers receive every page and keep none. ``speculative``: ``"dspark"`` or a drafter
        checkpoint directory; each decode worker loads the drafter and decodes with DSpark (a
        handed-off sequence first recomputes the drafter's context window, at most ``window``
        positions, as after a prefix-cache hit)."""
        if speculative is not None and not isinstance(speculative, str):
            raise TypeError(
                "speculative: PD workers load the drafter themselves; pass 'dspark' or a "
                f"checkpoint directory, got {type(speculative).__name__}"
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
        self._failed: str | None = None
        self._closed = False
        ctx = mp.get_context("spawn")
        self.prefill: list[WorkerProc] = []
        self.decode: list[WorkerProc] = []
        targets = [
            (prefill_main, "prefill", cfg.num_prefill_workers, self.prefill),
            (decode_main, "decode", cfg.num_decode_workers, self.decode),
        ]
        try:
            for target, role, count, procs in targets:
                for i in range(count):
                    parent, child = ctx.Pipe(duplex=True)
                    settings = base
                    if role == "prefill" and prefix_cache is not None:
                        settings = replace(base, cache=worker_cache_fields(prefix_cache, i))
                    if role == "decode" and speculative:
                        settings = replace(base, speculative=speculative)
                    args = (child, settings.to_json(), build)
                    proc = ctx.Process(
                        target=target, args=args, daemon=True, name=f"deepinfer-pd-{role}-{i}"
                    )
                    proc.start()
                    child.close()
                    procs.append(WorkerProc(WorkerView(len(procs), 1, 0, role), proc, parent))
            self._await_ready()
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------ lifecycle
    @property
    def workers(self) -> list[WorkerProc]:
        return self.prefill + self.decode

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
                if message["op"] == "fatal":
                    raise PDWorkerError(f"{proc.process.name} failed to start: {message['error']}")
                proc.view.block_size = int(message["block_size"])
                proc.view.kv_capacity_tokens = int(message["capacity_blocks"]) * int(
                    message["block_size"]
                )
                del waiting[id(proc.conn)]

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

    def __enter__(self) -> PDCoordinator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

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
        req.block_hashes = (
            prompt_block_hashes(prompt_ids, self.prefill[0].view.block_size, namespace)
            if self.prefix_cache is not None
            else ()
        )
        view = PDRequestView(
            int(rid[3:]), len(prompt_ids), params.max_tokens, namespace.hex(), 0, req.block_hashes
        )
        body = {
            "request_id": rid,
            "prompt_ids": req.prompt_ids,
            "params": params_to_json(params),
            "namespace": namespace.hex(),
        }
        # Decode workers keep no prefix cache: there the whole prompt is uncached.
        local = self.pd_policy.prefill_on_decode(len(prompt_ids))
        try:
            if local:
                req.decode = self._pair(view, len(prompt_ids))
                self._send(req.decode, {"op": "generate", **body})
                req.decode.view.in_flight[rid] = len(prompt_ids)
            else:
                req.prefill = self.prefill[
                    self.router.route(view, [p.view for p in self.prefill]).instance_id
                ]
                self._send(req.prefill, {"op": "prefill", **body})
                req.prefill.view.in_flight[rid] = len(prompt_ids)
        except (TypeError, ValueError) as exc:  # not JSON-serialisable prompt ids
            return rid, self._error_output(rid, req, str(exc))
        self._requests[rid] = req
        return rid, None

    def _pair(self, view: PDRequestView, kv_tokens: int) -> WorkerProc:
        views = [p.view for p in self.decode]
        chosen = self.pairing.pick(view, views, kv_tokens)
        if chosen is None:
            # Nobody has room right now: the decode worker queues it until blocks free up.
            chosen = min(views, key=lambda v: (v.kv_used_tokens, v.instance_id))
        return self.decode[chosen.instance_id]

    def poll(self, timeout: float) -> list[RequestOutput]:
        """Wait up to ``timeout`` s for worker messages; return the user-facing outputs."""
        self._check_usable()
        conns = {p.conn: p for p in self.workers}
        sentinels = {p.process.sentinel: p for p in self.workers}
        outputs: list[RequestOutput] = []
        for obj in wait(list(conns) + list(sentinels), timeout=timeout):
            if obj in sentinels and not sentinels[obj].conn.poll():
                proc = sentinels[obj]
                self._fail(f"{proc.process.name} died (exit code {proc.process.exitcode})")
            proc = conns.get(obj)  # type: ignore[call-overload]
            while proc is not None and proc.conn.poll():
                out = self._handle(proc, self._recv(proc))
                if out is not None:
                    outputs.append(out)
        return outputs

    def _send(self, proc: WorkerProc, message: dict[str, Any]) -> None:
        try:
            send(proc.conn, message)
        except OSError as exc:  # broken pipe: the worker is gone
            self._fail(f"{proc.process.name} is unreachable ({type(exc).__name__})")

    def _recv(self, proc: WorkerProc) -> dict[str, Any]:
        try:
            return recv(proc.conn)
        except (EOFError, OSError) as exc:
            self._fail(f"{proc.process.name} closed its pipe ({type(exc).__name__})")
            raise AssertionError("unreachable") from exc

    def _handle(self, proc: WorkerProc, message: dict[str, Any]) -> RequestOutput | None:
        op = message["op"]
        if op == "fatal":
            self._fail(f"{proc.process.name} failed: {message['error']}")
        rid = str(message.get("request_id"))
        req = self._requests.get(rid)
        if req is None:
            return None
        if op == "error":
            return self._error_output(rid, req, str(message["error"]))
        if op == "prefilled":
            proc.view.in_flight.pop(rid, None)
            req.shm = message["kv"]
            req.metrics.num_cached_tokens = int(message.get("num_cached_tokens", 0))
            proc.view.remember(req.block_hashes)  # the worker stored the prompt's full blocks
            req.decode = self._pair(
                PDRequestView(int(rid[3:]), len(req.prompt_ids), req.params.max_tokens),
                int(message["num_tokens"]),
            )
            self._send(
                req.decode,
                {
                    "op": "decode",
                    "request_id": rid,
                    "prompt_ids": req.prompt_ids,
                    "params": params_to_json(req.params),
                    "namespace": req.namespace.hex(),
                    "first_token": message["first_token"],
                    "kv": message["kv"],
                },
            )
            req.decode.view.in_flight[rid] = len(req.prompt_ids)
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
            return self._advance(rid, req, new, extra, reason)
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
            if outs:
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

    def generate(
        self,
        prompts: Seq[list[int] | Exception],
        params: Seq[SamplingParams],
        namespaces: Seq[bytes],
    ) -> list[RequestOutput]:
        """Outputs in prompt order; an ``Exception`` in ``prompts`` becomes that request's error."""
        order: list[str] = []
        done: dict[str, RequestOutput] = {}
        for prompt, p, ns in zip(prompts, params, namespaces):
            if isinstance(prompt, Exception):
                rid = f"pd-rejected-{next(self._ids)}"
                done[rid] = RequestOutput(
                    rid,
                    [],
                    finished=True,
                    finish_reason="error",
                    error=str(prompt),
                    metrics=RequestMetrics(arrival_time=0.0),
                )
            else:
                rid, failed = self.submit(prompt, p, ns)
                if failed is not None:
                    done[rid] = failed
            order.append(rid)
        for out in self.run_until(set(order) - set(done)):
            if out.finished:
                done[out.request_id] = out
        return [done[rid] for rid in order]

    def stream(
        self, prompt: list[int], params: SamplingParams, namespace: bytes = b""
    ) -> Iterator[RequestOutput]:
        rid, failed = self.submit(prompt, params, namespace)
        if failed is not None:
            yield failed
            return
        for out in self.run_until({rid}):
            if out.request_id == rid:
                yield out
