"""`ServeConfig`: what one `deepinfer serve` runs (validated when built)."""

from __future__ import annotations

from dataclasses import dataclass, field

from deepinfer.engine.cache_setup import PrefixCacheConfig
from deepinfer.engine.config import DTYPES, EngineConfig, SpeculativeConfig
from deepinfer.serve.ray_config import RayOptions
from deepinfer_sched.policies import ROUTERS


@dataclass(frozen=True)
class ServeConfig:
    """Replicas, routing, admission and shutdown of one server.

    ``model``: GGUF file or model directory (None: the embedded SmolLM2-135M-Instruct).
    ``replicas``: engine replicas, each in its own process (``in_process`` runs them as threads
    of the server process instead: same messages, for tests and tiny models).
    ``router``: a `deepinfer_sched` router name. ``ttft_slo_s``: reject (429) a request whose
    predicted TTFT on the chosen replica exceeds it. ``max_waiting``: reject (429) when the
    chosen replica already queues this many requests. ``drain_timeout_s``: on SIGTERM, how long
    in-flight requests may run before they are aborted. ``restart``: restart a replica that
    died. ``speculative``: each replica drafts with DSpark (``"dspark"``, a drafter
    checkpoint directory, or a `SpeculativeConfig` that also fixes the verify count or turns the
    draft gate off). ``pd``: ``(P, D)`` runs the first P replicas as prefill and the other D as decode
    replicas (``replicas`` must be P + D), paired per request with the PD KV transfer.
    ``ray``: run every replica as a Ray actor placed as `RayOptions` says (Ray is imported
    only then; KV pages of ``pd`` travel through Ray's object store).
    ``profile_out``: each replica records the steps it serves (batch composition -> iteration
    seconds, `deepinfer.profile.StepRecorder`) and writes them on shutdown to this path with
    ``-replica-<i>`` before the extension, for ``deepinfer-sched calibrate``.
    """

    model: str | None = None
    served_model_name: str | None = None
    replicas: int = 1
    router: str = "cost"
    in_process: bool = False
    dtype: str = "float32"
    device: str = "cpu"
    engine: EngineConfig = field(default_factory=EngineConfig)
    prefix_cache: PrefixCacheConfig | None = field(default_factory=PrefixCacheConfig)
    speculative: str | SpeculativeConfig | None = None
    threads_per_replica: int = 1
    cache_dir: str | None = None
    ttft_slo_s: float | None = None
    max_waiting: int | None = None
    drain_timeout_s: float = 30.0
    restart: bool = True
    startup_timeout_s: float = 600.0
    pd: tuple[int, int] | None = None
    ray: RayOptions | None = None
    profile_out: str | None = None

    def __post_init__(self) -> None:
        if self.speculative is not None and not isinstance(
            self.speculative, (str, SpeculativeConfig)
        ):
            raise ValueError(
                "speculative must be None, 'dspark', a drafter checkpoint directory or a "
                f"SpeculativeConfig, got {self.speculative!r}"
            )
        if not isinstance(self.replicas, int) or self.replicas < 1:
            raise ValueError(f"replicas must be an int >= 1, got {self.replicas!r}")
        if self.router not in ROUTERS:
            raise ValueError(f"router must be one of {ROUTERS}, got {self.router!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {self.dtype!r}")
        if not isinstance(self.threads_per_replica, int) or self.threads_per_replica < 1:
            raise ValueError(
                f"threads_per_replica must be an int >= 1, got {self.threads_per_replica!r}"
            )
        if self.ttft_slo_s is not None and not self.ttft_slo_s > 0:
            raise ValueError(f"ttft_slo_s must be > 0, got {self.ttft_slo_s}")
        if self.max_waiting is not None and self.max_waiting < 1:
            raise ValueError(f"max_waiting must be >= 1, got {self.max_waiting}")
        if not self.drain_timeout_s >= 0:
            raise ValueError(f"drain_timeout_s must be >= 0, got {self.drain_timeout_s}")
        if self.ray is not None and not isinstance(self.ray, RayOptions):
            raise ValueError(f"ray must be None or a RayOptions, got {self.ray!r}")
        if self.ray is not None and self.in_process:
            raise ValueError("ray and in_process are exclusive: replicas are Ray actors")
        if self.pd is not None:
            p, d = self.pd
            if not (isinstance(p, int) and isinstance(d, int) and p >= 1 and d >= 1):
                raise ValueError(f"pd must be (P, D) with P, D >= 1, got {self.pd!r}")
            if self.replicas != p + d:
                raise ValueError(f"replicas must be P + D = {p + d} with pd={self.pd}")
        if self.profile_out is not None and not self.profile_out:
            raise ValueError("profile_out must be None or a file path, got ''")
        if not self.startup_timeout_s > 0:
            raise ValueError(f"startup_timeout_s must be > 0, got {self.startup_timeout_s}")
