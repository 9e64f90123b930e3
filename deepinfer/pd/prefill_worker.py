"""The prefill worker: computes a prompt's KV and first token, then hands the pages over.

Each prompt runs through the worker's own `LLMEngine` (batched and chunked like any request)
with at most two tokens to generate; as soon as the first token is sampled, the prompt's KV
pages (every block, including the partial last one) are exported to shared memory, the request
is dropped from the engine, and a ``prefilled`` message carries the handle to the coordinator.
With a prefix cache, a prompt's cached leading blocks are loaded instead of computed, and its
full blocks are stored when it is handed off, so a conversation's next turn hits.
"""

from __future__ import annotations

from dataclasses import replace
from multiprocessing.connection import Connection
from typing import Any

from deepinfer.engine.engine import LLMEngine
from deepinfer.engine.outputs import RequestOutput
from deepinfer.engine.sampling_params import SamplingParams
from deepinfer.pd.messages import output_to_json, send
from deepinfer.pd.transport import export_pages
from deepinfer.pd.worker import EngineBuilder, Worker, serve


class PrefillWorker(Worker):
    def __init__(self, conn: Connection, engine: LLMEngine) -> None:
        super().__init__(conn, engine)
        self.prompt_lens: dict[str, int] = {}

    def on_message(self, message: dict[str, Any]) -> None:
        if message["op"] != "prefill":
            raise ValueError(f"prefill worker got unknown op {message['op']!r}")
        rid = str(message["request_id"])
        try:
            params = SamplingParams.from_json_dict(message["params"])
            # Two tokens keep the request alive after its first one, so its KV is still held.
            first_only = replace(
                params,
                max_tokens=min(params.max_tokens, 2),
                min_tokens=min(params.min_tokens, 2),  # min_tokens <= max_tokens
            )
            self.engine.add_request(
                message["prompt_ids"],
                first_only,
                request_id=rid,
                namespace=bytes.fromhex(message.get("namespace", "")),
            )
        except (ValueError, TypeError) as exc:
            send(self.conn, {"op": "error", "request_id": rid, "error": str(exc)})
            return
        self.prompt_lens[rid] = len(message["prompt_ids"])

    def on_output(self, out: RequestOutput) -> None:
        rid = out.request_id
        num_tokens = self.prompt_lens.pop(rid, 0)
        if out.finished or out.error is not None:
            # Stopped at its first token (or refused): nothing to decode.
            send(self.conn, output_to_json(out))
            return
        blocks = self.engine.kv_block_ids(rid)
        bs = self.engine.config.block_size
        handle = export_pages(self.engine.pool, blocks[: -(-num_tokens // bs)])
        # The prompt's full blocks stay in this worker's prefix cache for the next turn.
        self.engine.abort(rid, save_prefix=True)
        send(
            self.conn,
            {
                "op": "prefilled",
                "request_id": rid,
                "num_tokens": num_tokens,
                "num_cached_tokens": out.metrics.num_cached_tokens if out.metrics else 0,
                "first_token": out.new_token_ids[0],
                "first_text": out.new_text,
                "kv": handle,
            },
        )


def prefill_main(conn: Connection, settings_json: str, build: EngineBuilder) -> None:
    """Process entry point (spawn target); ``settings_json``: a `WorkerSettings`; ``build``: a
    module-level function assembling the engine (``deepinfer.llm.build_worker_engine``)."""
    serve(conn, settings_json, build, PrefillWorker)
