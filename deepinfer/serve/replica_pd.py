"""Prefill and decode roles of a replica (``deepinfer serve --pd P:D``), with today's KV
transfer (`deepinfer.pd.transport`: pages through POSIX shared memory, JSON handles).

A prefill replica runs a ``prefill`` request like any other, with at most two tokens to go; as
soon as its first token is sampled it exports the prompt's KV pages, drops the request (its
full blocks stay in the replica's prefix cache for the next turn) and answers ``prefilled``
with the first token (and its log-probabilities, when asked) and the page handle. The front
pairs it with a decode replica (`deepinfer_sched`'s `LeastLoadedPairing`), which receives
``decode``: it imports the pages into its own blocks when it has room
(`LLMEngine.add_prefilled_request`) and streams the request from its first token on.
"""

from __future__ import annotations

from collections import deque
from dataclasses import replace
from functools import partial
from typing import Any, Protocol

from deepinfer.engine.engine import LLMEngine
from deepinfer.engine.outputs import RequestOutput
from deepinfer.engine.sampling_params import SamplingParams
from deepinfer.models.kv_pool import OutOfBlocksError
from deepinfer.pd import transport as shm_transport
from deepinfer.serve.logprobs import to_wire


class KVTransport(Protocol):
    """How a replica's KV pages travel: POSIX shared memory (`deepinfer.pd.transport`, the
    default) or Ray's object store (`deepinfer.serve.ray_transport`, replicas on Ray)."""

    def export_pages(self, pool: Any, block_ids: list[int]) -> dict[str, Any]: ...
    def import_pages(self, pool: Any, handle: dict[str, Any], block_ids: list[int]) -> None: ...
    def discard(self, handle: dict[str, Any]) -> bool: ...


class PDRole:
    """The prefill and decode bookkeeping of one replica (either may be idle)."""

    def __init__(self, engine: LLMEngine, transport: KVTransport | None = None) -> None:
        self.engine = engine
        self.transport: KVTransport = shm_transport if transport is None else transport
        self.prefilling: dict[str, int] = {}  # request id -> prompt length
        self.pending: deque[dict[str, Any]] = deque()  # decodes waiting for KV room

    def busy(self) -> bool:
        return bool(self.pending)

    def start_prefill(self, message: dict[str, Any]) -> None:
        """Queue a prompt to prefill; raises ``ValueError``/``TypeError`` for a bad one."""
        rid = str(message["request_id"])
        params = SamplingParams.from_json_dict(message["params"])
        # Two tokens keep the request alive after its first one, so its KV is still held.
        first_only = replace(params, max_tokens=min(params.max_tokens, 2))
        self.engine.add_request(
            [int(t) for t in message["prompt_ids"]],
            first_only,
            request_id=rid,
            namespace=bytes.fromhex(message.get("namespace", "")),
        )
        self.prefilling[rid] = len(message["prompt_ids"])

    def finish_prefill(self, out: RequestOutput) -> dict[str, Any] | None:
        """For a prefilling request's first output: export its KV and drop it, returning the
        ``prefilled`` message; None when it already finished (send it as a normal output)."""
        num_tokens = self.prefilling.pop(out.request_id)
        if out.finished or out.error is not None:
            return None
        blocks = self.engine.kv_block_ids(out.request_id)
        bs = self.engine.config.block_size
        handle = self.transport.export_pages(self.engine.pool, blocks[: -(-num_tokens // bs)])
        m = out.metrics
        first = out.outputs[0].logprobs
        self.engine.abort(out.request_id, save_prefix=True)
        return {
            "op": "prefilled",
            "request_id": out.request_id,
            "first_token": out.new_token_ids[0],
            "kv": handle,
            "prompt_tokens": num_tokens,
            "cached_tokens": m.num_cached_tokens if m else 0,
            # The decode replica never sees the first token's distribution: the front patches
            # these into its first output.
            "first_logprobs": to_wire(first[:1]) if first else None,
        }

    def abort(self, request_id: str) -> None:
        self.prefilling.pop(request_id, None)
        for message in list(self.pending):
            if str(message["request_id"]) == request_id:
                self.pending.remove(message)
                self.transport.discard(message["kv"])

    def admit_decodes(self) -> list[RequestOutput | tuple[str, str]]:
        """Import waiting transfers in order while the pool has room. Returns each admitted
        request's first output, or ``(request_id, error)`` for one that cannot run here."""
        results: list[RequestOutput | tuple[str, str]] = []
        while self.pending:
            message = self.pending[0]
            rid = str(message["request_id"])
            try:
                out = self.engine.add_prefilled_request(
                    [int(t) for t in message["prompt_ids"]],
                    int(message["first_token"]),
                    SamplingParams.from_json_dict(message["params"]),
                    partial(self.transport.import_pages, self.engine.pool, message["kv"]),
                    request_id=rid,
                    namespace=bytes.fromhex(message.get("namespace", "")),
                )
            except OutOfBlocksError:
                if self.engine.has_unfinished():
                    return results  # running sequences will free blocks
                self.pending.popleft()
                self.transport.discard(message["kv"])
                results.append((rid, "the request does not fit in the decode replica's KV pool"))
                continue
            except (ValueError, TypeError) as exc:
                self.pending.popleft()
                self.transport.discard(message["kv"])
                results.append((rid, str(exc)))
                continue
            self.pending.popleft()
            results.append(out)
        return results

    def shutdown(self) -> None:
        while self.pending:
            self.transport.discard(self.pending.popleft()["kv"])
