"""Handling what PD workers send back: readiness, prefilled hand-offs, decode outputs,
errors and deaths (layer of `PDCoordinator`, see ``coordinator_state.py``)."""

from __future__ import annotations

import time
from multiprocessing.connection import wait
from typing import Any

from deepinfer.engine.outputs import RequestOutput
from deepinfer.pd.request_dispatch import RequestDispatch
from deepinfer.pd.state import WorkerProc
from deepinfer.pd.transport import discard
from deepinfer.pd.worker_lifecycle import WorkerLifecycle


class MessageRelay(WorkerLifecycle, RequestDispatch):
    """Poll the workers and turn their messages into the caller's outputs."""

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
