"""The decode worker: receives prefilled requests' KV pages and decodes them to completion.

A ``decode`` message names a shared-memory segment with the prompt's pages; the worker
allocates blocks in its own pool, scatters the pages in (unlinking the segment) and registers
the request as running through `LLMEngine.add_prefilled_request`. Requests that do not fit
yet wait in arrival order until finished sequences free blocks. A ``generate`` message is a
request that the per-request PD policy prefills here, locally.
"""

from __future__ import annotations

from collections import deque
from functools import partial
from multiprocessing.connection import Connection
from typing import Any

from deepinfer.engine.engine import LLMEngine
from deepinfer.engine.outputs import RequestOutput
from deepinfer.engine.sampling_params import SamplingParams
from deepinfer.models.kv_pool import OutOfBlocksError
from deepinfer.pd.messages import output_to_json, send
from deepinfer.pd.transport import discard, import_pages
from deepinfer.pd.worker import EngineBuilder, Worker, serve


class DecodeWorker(Worker):
    def __init__(self, conn: Connection, engine: LLMEngine) -> None:
        super().__init__(conn, engine)
        self.pending: deque[dict[str, Any]] = deque()

    def busy(self) -> bool:
        return self.engine.has_unfinished() or bool(self.pending)

    def on_message(self, message: dict[str, Any]) -> None:
        op = message["op"]
        if op == "decode":
            self.pending.append(message)
            self.on_idle()
        elif op == "generate":
            rid = str(message["request_id"])
            try:
                self.engine.add_request(
                    message["prompt_ids"],
                    SamplingParams.from_json_dict(message["params"]),
                    request_id=rid,
                    namespace=bytes.fromhex(message.get("namespace", "")),
                )
            except (ValueError, TypeError) as exc:
                send(self.conn, {"op": "error", "request_id": rid, "error": str(exc)})
        else:
            raise ValueError(f"decode worker got unknown op {op!r}")

    def on_idle(self) -> None:
        """Admit waiting transfers in order while the pool has room for them."""
        while self.pending:
            message = self.pending[0]
            rid = str(message["request_id"])
            pool = self.engine.pool
            try:
                out = self.engine.add_prefilled_request(
                    message["prompt_ids"],
                    int(message["first_token"]),
                    SamplingParams.from_json_dict(message["params"]),
                    partial(import_pages, pool, message["kv"]),
                    request_id=rid,
                    namespace=bytes.fromhex(message.get("namespace", "")),
                )
            except OutOfBlocksError:
                if self.engine.has_unfinished():
                    return  # retry once running sequences free blocks
                self.pending.popleft()
                discard(message["kv"])
                send(
                    self.conn,
                    {
                        "op": "error",
                        "request_id": rid,
                        "error": "request does not fit in the decode worker's KV pool",
                    },
                )
                continue
            except (ValueError, TypeError) as exc:
                self.pending.popleft()
                discard(message["kv"])
                send(self.conn, {"op": "error", "request_id": rid, "error": str(exc)})
                continue
            self.pending.popleft()
            self.on_output(out)

    def on_output(self, out: RequestOutput) -> None:
        send(self.conn, output_to_json(out))

    def shutdown(self) -> None:
        while self.pending:
            discard(self.pending.popleft()["kv"])


def decode_main(conn: Connection, settings_json: str, build: EngineBuilder) -> None:
    """Process entry point (spawn target); ``settings_json``: a `WorkerSettings`; ``build``: a
    module-level function assembling the engine (``deepinfer.llm.build_worker_engine``)."""
    serve(conn, settings_json, build, DecodeWorker)
