"""`RayBackend`: connect to Ray, reserve a placement group per replica pool, create the
replica actors in its bundles, and release it all at the end.

Pools: without ``--pd`` every replica belongs to the ``both`` pool; with ``--pd P:D`` the first P
form the ``prefill`` pool and the other D the ``decode`` pool. Each pool is one placement group
with one bundle per replica: ``{"CPU": num_cpus, "GPU": num_gpus, **custom}``, where the custom
resources (`RayOptions.pool_resources`) are how a pool is pinned to a node group. The whole pool
is placed before any replica starts, so a cluster too small fails at once with a clear error
instead of leaving half the replicas pending.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import uuid
from typing import Any

import ray
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from deepinfer.serve.config import ServeConfig
from deepinfer.serve.ray_actor import ReplicaActor
from deepinfer.serve.ray_config import RayOptions
from deepinfer.serve.ray_handle import RayReplicaHandle
from deepinfer.serve.replica import ReplicaSettings

MAX_CONCURRENCY = 4  # poll, push, shutdown and a diagnostic call may overlap


def pool_of(config: ServeConfig, index: int) -> str:
    """The pool (``both`` / ``prefill`` / ``decode``) of replica ``index``."""
    if config.pd is None:
        return "both"
    return "prefill" if index < config.pd[0] else "decode"


class RayBackend:
    """Ray-side resources of one `ServeService`."""

    def __init__(self, config: ServeConfig, options: RayOptions, owns_ray: bool) -> None:
        self.config = config
        self.options = options
        self.owns_ray = owns_ray
        self.tag = uuid.uuid4().hex[:8]
        self.groups: dict[str, tuple[PlacementGroup, dict[str, float]]] = {}
        self._actor_class = ray.remote(ReplicaActor)
        sizes: dict[str, int] = {}
        for i in range(config.replicas):
            pool = pool_of(config, i)
            sizes[pool] = sizes.get(pool, 0) + 1
        for pool, n in sizes.items():
            bundle = {"CPU": float(options.num_cpus), **options.pool_resources(pool)}
            gpus = options.gpus_for(config.device)
            if gpus:
                bundle["GPU"] = gpus
            bundle = {k: v for k, v in bundle.items() if v}
            group = placement_group(
                [dict(bundle) for _ in range(n)],
                strategy=options.strategy,
                name=f"deepinfer-{self.tag}-{pool}",
            )
            self.groups[pool] = (group, bundle)

    @classmethod
    def connect(cls, config: ServeConfig) -> RayBackend:
        """Join (or start) Ray as ``config.ray`` says and request the pools' placement groups."""
        options = config.ray
        if options is None:
            raise ValueError("RayBackend needs ServeConfig.ray")
        owns = False
        if not ray.is_initialized():
            # None means a new local instance ("local"), not whichever cluster Ray would find
            # on this machine; "auto" joins the one `ray start` runs here.
            address = "local" if options.address is None else options.address
            main = threading.current_thread() is threading.main_thread()
            previous = signal.getsignal(signal.SIGTERM) if main else None
            ray.init(address=address, namespace=options.namespace)
            if previous is not None:
                # ray.init makes SIGTERM exit at once; the server's own handler drains first.
                signal.signal(signal.SIGTERM, previous)
            owns = True
        return cls(config, options, owns)

    def wait_placed(self) -> None:
        """Block until every pool is placed; ``RuntimeError`` naming the pool and what it asked
        for (and what the cluster has) if Ray cannot place it in time."""
        for pool, (group, bundle) in self.groups.items():
            try:
                ray.get(group.ready(), timeout=self.options.placement_timeout_s)
            except ray.exceptions.GetTimeoutError:
                n = len(group.bundle_specs)
                have = ray.cluster_resources()  # type: ignore[no-untyped-call]
                self.close()
                raise RuntimeError(
                    f"Ray could not place the {pool} pool ({n} x {bundle}, strategy "
                    f"{self.options.strategy}) within {self.options.placement_timeout_s} s; "
                    f"the cluster has {have}"
                ) from None

    def handle(self, settings: ReplicaSettings) -> RayReplicaHandle:
        """The handle of replica ``settings.index``; its actor is created on first start."""
        pool = pool_of(self.config, settings.index)
        group, bundle = self.groups[pool]
        slot = sum(1 for i in range(settings.index) if pool_of(self.config, i) == pool)

        def make_actor() -> Any:
            custom = {k: v for k, v in bundle.items() if k not in ("CPU", "GPU")}
            return self._actor_class.options(
                num_cpus=bundle.get("CPU", 0.0),
                num_gpus=bundle.get("GPU", 0.0),
                resources=custom,
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    group, placement_group_bundle_index=slot
                ),
                max_restarts=self.options.max_restarts,
                max_concurrency=MAX_CONCURRENCY,
                name=f"deepinfer-{self.tag}-replica-{settings.index}-{uuid.uuid4().hex[:4]}",
            ).remote(settings.to_json())

        return RayReplicaHandle(
            settings, role=pool, make_actor=make_actor, max_restarts=self.options.max_restarts
        )

    def close(self) -> None:
        """Release the placement groups (and Ray, if this backend started it)."""
        for group, _ in self.groups.values():
            with contextlib.suppress(Exception):  # already gone with the cluster
                remove_placement_group(group)
        self.groups.clear()
        if self.owns_ray and ray.is_initialized():
            ray.shutdown()
