"""What the prefill and decode worker processes share: start-up and the serve loop.

A worker is started with the ``spawn`` context and receives only its end of a pipe and plain
``str``/``int`` settings; it loads the model itself, answers ``ready`` (or ``fatal``), then
alternates between reading JSON messages and stepping its own `LLMEngine`.
"""

from __future__ import annotations

import contextlib
import json
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

import torch

from deepinfer.engine.cache_setup import (
    PrefixCacheConfig,
    build_engine_kv,
)
from deepinfer.engine.config import EngineConfig
from deepinfer.engine.engine import LLMEngine
from deepinfer.engine.outputs import RequestOutput
from deepinfer.engine.sampling_params import SamplingParams
from deepinfer.model.loader import load_model
from deepinfer.pd.messages import recv, send
from deepinfer_cache import TieredKVStore
from deepinfer_kernels import gather_blocks

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

# While idle, wake up this often to notice a vanished coordinator (EOF on the pipe).
IDLE_POLL_S = 1.0


def build_engine(
    model_dir: str,
    dtype: str,
    device: str,
    engine_json: str,
    cache_json: str = "",
    speculative: str = "",
) -> tuple[LLMEngine, TieredKVStore | None]:
    """The worker's engine, with a prefix cache when ``cache_json`` holds a
    `PrefixCacheConfig` plus ``"directory_suffix"``, which makes this worker's disk directory
    its own (a disk directory has one writer), and DSpark when ``speculative`` is ``"dspark"``
    or a drafter checkpoint directory (the worker loads the drafter itself)."""
    loaded = load_model(model_dir, dtype=_DTYPES[dtype], device=device)
    config = EngineConfig(**json.loads(engine_json))
    cache, suffix = None, ""
    if cache_json:
        fields = json.loads(cache_json)
        suffix = fields.pop("directory_suffix")
        cache = PrefixCacheConfig(**fields)
    pool, adapter, store = build_engine_kv(
        loaded.model, config, cache, model_dir, directory_suffix=suffix
    )
    speculator = None
    if speculative:
        from deepinfer.spec import build_speculator  # lazy: deepinfer.spec imports the engine

        speculator = build_speculator(speculative, loaded.model, pool, max_seqs=config.max_num_seqs)
    engine = LLMEngine(
        loaded.model,
        loaded.tokenizer,
        config,
        prefix_cache=adapter,
        pool=pool,
        speculator=speculator,
    )
    # Pay one-off costs (lazy imports, first kernels, page moves) before reporting ready, so
    # the first real request's latency is representative.
    engine.add_request([0], SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True))
    while engine.has_unfinished():
        engine.step()
    gather_blocks(engine.pool.tensor, torch.zeros(1, dtype=torch.int64), block_dim=2)
    return engine, store


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
    model_dir: str,
    dtype: str,
    device: str,
    engine_json: str,
    threads: int,
    make: Callable[[Connection, LLMEngine], Worker],
    cache_json: str = "",
    speculative: str = "",
) -> None:
    """The body of a worker process; returns on ``shutdown`` or when the coordinator is gone."""
    torch.set_num_threads(threads)
    try:
        engine, store = build_engine(model_dir, dtype, device, engine_json, cache_json, speculative)
    except Exception as exc:  # report any start-up failure instead of dying silently
        send(conn, {"op": "fatal", "error": f"{type(exc).__name__}: {exc}"})
        return
    worker = make(conn, engine)
    send(
        conn,
        {
            "op": "ready",
            "capacity_blocks": engine.capacity_blocks,
            "block_size": engine.config.block_size,
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
