"""`PDCoordinator`: owns the prefill and decode worker processes and routes every request.

Per request: the PD policy (``deepinfer_sched``'s `DisaggregatedPD` or `PerRequestPD`) decides
whether it prefills on a prefill worker (chosen by a ``deepinfer_sched`` router) or locally on
its decode worker; a prefilled request's KV is then paired to a decode worker by
`LeastLoadedPairing`. The coordinator relays JSON messages only; KV pages go from worker to
worker through shared memory. A worker that dies fails only the requests it had streamed from
(the others run again elsewhere) and is started again; silence longer than the request timeout
while work is outstanding raises `PDWorkerError` instead of hanging.

One concept per module: `PDCoordinator` here holds construction and the batch API over the
layers of ``coordinator_state.py``.
"""

from __future__ import annotations

import dataclasses
import itertools
import multiprocessing as mp
import time
from collections.abc import Iterator
from dataclasses import replace

from deepinfer.engine.cache_setup import PrefixCacheConfig
from deepinfer.engine.config import EngineConfig, SpeculativeConfig
from deepinfer.engine.outputs import RequestOutput
from deepinfer.pd.config import PDConfig
from deepinfer.pd.coordinator_state import PDWorkerError
from deepinfer.pd.message_relay import MessageRelay
from deepinfer.pd.routing import make_router, worker_cache_fields
from deepinfer.pd.state import RequestState, WorkerProc
from deepinfer.pd.worker import EngineBuilder, WorkerSettings
from deepinfer.pd.worker_lifecycle import MAX_REQUEST_RETRIES
from deepinfer_sched.policies import (
    DisaggregatedPD,
    LeastLoadedPairing,
    PerRequestPD,
)
from deepinfer_sched.policies.base import PDPolicy

__all__ = ["MAX_REQUEST_RETRIES", "PDCoordinator", "PDWorkerError"]


class PDCoordinator(MessageRelay):
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

    def __enter__(self) -> PDCoordinator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

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
