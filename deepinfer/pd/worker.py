"""What the prefill and decode worker processes share: start-up and the serve loop.

A worker is started with the ``spawn`` context and receives only its end of a pipe and a
:class:`WorkerSettings` as a JSON string; it loads the model (and any drafter) itself, answers
``ready`` (or ``fatal``), then alternates between reading JSON messages and stepping its own
`LLMEngine`.
"""

from __future__ import annotations

import contextlib
import json
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from multiprocessing.connection import Connection
from typing import Any

import torch

from deepinfer.engine.config import torch_dtype
from deepinfer.engine.engine import LLMEngine
from deepinfer.engine.outputs import RequestOutput
from deepinfer.engine.sampling_params import SamplingParams
from deepinfer.pd.messages import recv, send
from deepinfer_cache import DEFAULT_KEY_HASH, TieredKVStore
from deepinfer_kernels import gather_blocks

# While idle, wake up this often to notice a vanished coordinator (EOF on the pipe).
IDLE_POLL_S = 1.0


@dataclass(frozen=True)
class WorkerSettings:
    """Everything a worker process is started with, sent as one JSON string (no pickle).

    ``engine``: `EngineConfig` fields; ``cache``: `PrefixCacheConfig` fields plus
    ``"directory_suffix"`` (this worker's own disk directory: a directory has one writer), or
    None for no prefix cache; ``speculative``: `SpeculativeConfig` fields (the worker loads the
    drafter itself), None for none; ``cache_dir``: where converted models
    are cached (empty: the default), as the parent's ``load_model`` used.
    """

    model_dir: str
    dtype: str = "float32"
    device: str = "cpu"
    engine: dict[str, Any] = field(default_factory=dict)
    threads: int = 1
    cache: dict[str, Any] | None = None
    speculative: dict[str, Any] | None = None
    cache_dir: str = ""

    def __post_init__(self) -> None:
        torch_dtype(self.dtype)  # ValueError names the choices
        if not isinstance(self.threads, int) or self.threads < 1:
            raise ValueError(f"threads: expected a positive int, got {self.threads!r}")
        if self.cache is not None and "directory_suffix" not in self.cache:
            raise ValueError("cache: expected PrefixCacheConfig fields plus 'directory_suffix'")

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> WorkerSettings:
        return cls(**json.loads(text))


EngineBuilder = Callable[[WorkerSettings], tuple[LLMEngine, TieredKVStore | None]]
"""Builds a worker's engine from its settings (``deepinfer.llm.build_worker_engine``; the
composition root sits above this package, so the coordinator is handed it)."""


def warm_up(engine: LLMEngine) -> None:
    """Pay one-off costs (lazy imports, first kernels, page moves) before reporting ready, so
    the first real request's latency is representative."""
    engine.add_request([0], SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True))
    while engine.has_unfinished():
        engine.step()
    gather_blocks(engine.pool.tensor, torch.zeros(1, dtype=torch.int64), block_dim=2)


class Worker:
    """One worker's engine plus the hooks its role fills in."""

    def __init__(self, conn: Connection, engine: LLMEngine) -> None:
        self.conn = conn
        self.engine = engine

    def on_message(self, message: dict[str, Any]) -> None:
        raise NotImplementedError

    def on_output(self, out: RequestOutput) -> None:
        raise NotImplementedError

    def on_idle(self) -> None:
        """Called once per loop turn (retry deferred work)."""

    def busy(self) -> bool:
        return self.engine.has_unfinished()

    def shutdown(self) -> None:
        """Release what the worker still holds (called once, before exit)."""


def serve(
    conn: Connection,
    settings_json: str,
    build: EngineBuilder,
    make: Callable[[Connection, LLMEngine], Worker],
) -> None:
    """The body of a worker process (``settings_json``: a :class:`WorkerSettings`; ``build``
    assembles its engine); returns on ``shutdown`` or when the coordinator is gone."""
    store: TieredKVStore | None = None
    try:
        settings = WorkerSettings.from_json(settings_json)
        torch.set_num_threads(settings.threads)
        engine, store = build(settings)
        warm_up(engine)
    except Exception as exc:  # report any start-up failure instead of dying silently
        if store is not None:
            store.close()
        send(conn, {"op": "fatal", "error": f"{type(exc).__name__}: {exc}"})
        return
    worker = make(conn, engine)
    send(
        conn,
        {
            "op": "ready",
            "capacity_blocks": engine.capacity_blocks,
            "block_size": engine.config.block_size,
            # The block-key scheme and key material of this worker's cache, so the
            # coordinator hashes prompts exactly as the worker's store does.
            "hash_model": store.model.hex() if store is not None else "",
            "key_hash": store.key_hash if store is not None else DEFAULT_KEY_HASH,
        },
    )
    try:
        while True:
            # Block for work only when idle; otherwise just drain what has arrived.
            timeout = 0.0 if worker.busy() else IDLE_POLL_S
            while conn.poll(timeout):
                message = recv(conn)
                if message["op"] == "shutdown":
                    return
                worker.on_message(message)
                timeout = 0.0
            worker.on_idle()
            if engine.has_unfinished():
                for out in engine.step():
                    worker.on_output(out)
    except (EOFError, BrokenPipeError, ConnectionResetError):
        return  # the coordinator went away
    except Exception as exc:
        with contextlib.suppress(OSError):
            send(
                conn,
                {
                    "op": "fatal",
                    "error": f"{type(exc).__name__}: {exc}",
                    "trace": traceback.format_exc(),
                },
            )
    finally:
        worker.shutdown()
        if store is not None:
            store.close()  # write-back tiers persist to disk; the directory lock is released
