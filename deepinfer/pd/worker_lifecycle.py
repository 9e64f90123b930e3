"""Starting, stopping and restarting the PD worker processes, and what a worker's death
costs the requests it held (layer of `PDCoordinator`, see ``coordinator_state.py``)."""

from __future__ import annotations

import time
from multiprocessing.connection import wait
from typing import Any

from deepinfer.engine.outputs import RequestOutput
from deepinfer.pd.coordinator_state import PDWorkerError
from deepinfer.pd.decode_worker import decode_main
from deepinfer.pd.messages import send
from deepinfer.pd.prefill_worker import prefill_main
from deepinfer.pd.request_outputs import RequestOutputs
from deepinfer.pd.state import WorkerProc
from deepinfer.pd.transport import discard
from deepinfer.pd.views import WorkerView

# Times one request is sent again after the worker holding it died before it streamed.
MAX_REQUEST_RETRIES = 2


class WorkerLifecycle(RequestOutputs):
    """A worker process from its start to its death, and its restart in the same slot."""

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

    def _check_startups(self) -> None:
        """Kill workers stuck in start-up beyond the start-up timeout (handled as deaths)."""
        now = time.monotonic()
        for proc in self.workers:
            if proc.retired or proc.ready or not proc.process.is_alive():
                continue
            if now - proc.started_at > self.config.startup_timeout_s:
                proc.process.kill()  # its sentinel fires on the next poll
