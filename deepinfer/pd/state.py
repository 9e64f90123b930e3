"""The coordinator's bookkeeping: one record per worker process and per request in flight."""

from __future__ import annotations

from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

from deepinfer.engine.outputs import RequestMetrics
from deepinfer.engine.sampling_params import SamplingParams
from deepinfer.pd.views import WorkerView


@dataclass
class WorkerProc:
    """A worker process, its pipe end, and the policy view the coordinator keeps of it."""

    view: WorkerView
    process: Any  # multiprocessing's SpawnProcess
    conn: Connection
    settings_json: str = ""  # what it was started with, to start it again
    ready: bool = False  # reported ready; only ready workers get requests
    started_at: float = 0.0  # time.monotonic() of the start
    failed_starts: int = 0  # consecutive starts that died before ready
    retired: bool = False  # out of service for good (too many failed starts)


@dataclass
class RequestState:
    """A request in flight: where it runs, what the caller has seen, its undelivered KV."""

    prompt_ids: list[int]
    params: SamplingParams
    namespace: bytes
    metrics: RequestMetrics
    decode: WorkerProc | None = None
    prefill: WorkerProc | None = None
    delivered: int = 0
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    shm: dict[str, Any] | None = None
    block_hashes: tuple[int, ...] = ()  # the prompt's, when prefill workers keep a cache
    handoff: dict[str, Any] | None = None  # a prefilled request's decode message, unsent
    retries: int = 0  # times it was sent again after its worker died
