"""Starting the serving service's replicas, its health, draining and closing (layer of
`ServeService`, see ``service_state.py``)."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import Any

from deepinfer.engine.config import SpeculativeConfig
from deepinfer.serve.frontend import load_frontend
from deepinfer.serve.replica import ReplicaSettings, replica_profile_path
from deepinfer.serve.replica_events import ReplicaEvents
from deepinfer.serve.replica_handle import ReplicaHandle, ReplicaStatus


class ServiceLifecycle(ReplicaEvents):
    """Bring the replicas up, report on them, and stop them."""

    async def start(self) -> None:
        """Load the tokenizer, start every replica, wait until all report ready (or one fails
        to start: ``RuntimeError``)."""
        self._loop = asyncio.get_running_loop()
        cfg = self.config
        if self.frontend is None:
            self.frontend = await asyncio.to_thread(
                load_frontend, cfg.model, cfg.served_model_name, cfg.cache_dir
            )
        # Replicas load the model from its source, as `LLM` does: a GGUF file keeps its
        # quantized block formats (4-8x less memory and bandwidth than the converted copy the
        # front reads its tokenizer from).
        model = cfg.model
        if cfg.ray is not None:
            from deepinfer.serve.ray_backend import RayBackend  # Ray only with --ray

            self._ray = RayBackend.connect(cfg)
            await asyncio.to_thread(self._ray.wait_placed)
        for i in range(cfg.replicas):
            cache = None
            if cfg.prefix_cache is not None:
                cache = {
                    **dataclasses.asdict(cfg.prefix_cache),
                    "directory_suffix": f"-replica-{i}",
                }
            settings = ReplicaSettings(
                model=model,
                index=i,
                dtype=cfg.dtype,
                device=cfg.device,
                engine=dataclasses.asdict(cfg.engine),
                cache=cache,
                speculative=(
                    cfg.speculative.to_dict()
                    if isinstance(cfg.speculative, SpeculativeConfig)
                    else cfg.speculative or ""
                ),
                threads=cfg.threads_per_replica,
                cache_dir=cfg.cache_dir,
                profile_out=replica_profile_path(cfg.profile_out, i),
            )
            handle = (
                ReplicaHandle(settings, in_process=cfg.in_process)
                if self._ray is None
                else self._ray.handle(settings)
            )
            self.replicas.append(handle)
            self.metrics.up.labels(str(i)).set(0)
            handle.start(self._loop, self._on_message)
        deadline = time.monotonic() + cfg.startup_timeout_s
        while any(h.status is ReplicaStatus.STARTING for h in self.replicas):
            if time.monotonic() > deadline:
                raise RuntimeError(f"replicas did not start within {cfg.startup_timeout_s} s")
            await asyncio.sleep(0.05)
        failed = [h for h in self.replicas if h.status is not ReplicaStatus.UP]
        if failed:
            errors = "; ".join(f"replica {h.index}: {h.error}" for h in failed)
            await self.close()
            raise RuntimeError(f"replicas failed to start: {errors}")

    @property
    def model_name(self) -> str:
        assert self.frontend is not None
        return self.frontend.name

    def health(self) -> tuple[bool, dict[str, Any]]:
        up = [h for h in self.replicas if h.status is ReplicaStatus.UP]
        status = "draining" if self.draining else ("ok" if up else "starting")
        body = {
            "status": status,
            "replicas": [
                {
                    "index": h.index,
                    "role": self.role(h),
                    "status": h.status.value,
                    "pid": h.pid,
                    "restarts": h.restarts,
                    "num_waiting": h.view.num_waiting,
                    "num_running": h.view.num_running,
                    "free_blocks": h.view.free_blocks,
                    "capacity_blocks": h.view.capacity_blocks,
                    "cached_blocks": len(h.view.held),
                }
                for h in self.replicas
            ],
            "in_flight": len(self._tracked),
        }
        return status == "ok", body

    async def drain(self, timeout_s: float | None = None) -> int:
        """Refuse new requests; wait up to ``timeout_s`` for in-flight ones; abort the rest.
        Returns how many were aborted."""
        self.draining = True
        timeout = self.config.drain_timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + timeout
        while self._tracked and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        left = list(self._tracked.values())
        for t in left:
            self._fail(t, "the server is shutting down; the request was aborted")
        return len(left)

    async def close(self) -> None:
        """Stop every replica (each flushes its prefix cache's disk tier first)."""
        if self.closed:
            return
        self.closed = True
        self.draining = True
        for timer in self._restart_handles.values():
            timer.cancel()
        for t in list(self._tracked.values()):
            self._fail(t, "the server is shutting down")
        await asyncio.gather(
            *(asyncio.to_thread(h.stop, 30.0) for h in self.replicas), return_exceptions=True
        )
        if self._ray is not None:
            await asyncio.to_thread(self._ray.close)
