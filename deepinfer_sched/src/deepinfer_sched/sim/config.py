"""Simulation configuration: cluster shape, hardware/model names, caches, SLO, faults."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from deepinfer_sched._checks import check_bool, check_int, check_real
from deepinfer_sched.policies.autoscale import AutoscaleConfig
from deepinfer_sched.policies.config import SchedulerConfig

__all__ = ["Fault", "InstanceType", "SimConfig", "SpecDecodeConfig"]


@dataclass(frozen=True)
class SpecDecodeConfig:
    """Speculative-decoding hook: ``gamma`` draft tokens verified per sequence and step.

    Accepted drafts per step follow ``acceptance``: ``"geometric"`` accepts draft ``k``
    with probability ``alpha`` given drafts ``< k`` were accepted (so
    ``P(accepted >= k) = alpha^k``, capped at ``gamma``); ``"fixed"`` accepts
    ``round(alpha * gamma)`` every step. Each step emits accepted + 1 tokens (the bonus or
    correction token) and its batch carries ``gamma + 1`` tokens per sequence.
    """

    gamma: int = 5
    alpha: float = 0.7
    acceptance: str = "geometric"

    def __post_init__(self) -> None:
        check_int("SpecDecodeConfig", "gamma", self.gamma)
        check_real("SpecDecodeConfig", "alpha", self.alpha)
        if self.gamma < 1:
            raise ValueError(f"gamma must be >= 1, got {self.gamma}")
        if not 0.0 <= self.alpha <= 1.0:
            raise ValueError(f"alpha must be in [0, 1], got {self.alpha}")
        if self.acceptance not in ("geometric", "fixed"):
            raise ValueError(f"acceptance must be 'geometric' or 'fixed', got {self.acceptance!r}")


@dataclass(frozen=True)
class InstanceType:
    """``count`` instances of ``num_gpus`` x ``hardware`` serving ``model`` (None: the
    config's model), for mixed pools; entries fill instance ids in order."""

    count: int
    hardware: str
    num_gpus: int = 1
    model: str | None = None

    def __post_init__(self) -> None:
        check_int("InstanceType", "count", self.count)
        check_int("InstanceType", "num_gpus", self.num_gpus)
        if self.count < 1 or self.num_gpus < 1:
            raise ValueError("InstanceType.count and num_gpus must be >= 1")
        if not isinstance(self.hardware, str) or not (
            self.model is None or isinstance(self.model, str)
        ):
            raise TypeError("InstanceType.hardware and model must be strings")


@dataclass(frozen=True)
class Fault:
    """Instance ``instance_id`` dies at ``time_s``; its work is rerouted and re-prefilled."""

    time_s: float
    instance_id: int

    def __post_init__(self) -> None:
        check_real("Fault", "time_s", self.time_s, finite=False)
        check_int("Fault", "instance_id", self.instance_id)
        if not (self.time_s >= 0 and math.isfinite(self.time_s)):
            raise ValueError(f"Fault.time_s must be finite and >= 0, got {self.time_s}")
        if self.instance_id < 0:
            raise ValueError(f"Fault.instance_id must be >= 0, got {self.instance_id}")


_INT_FIELDS = ("num_instances", "num_prefill", "num_gpus", "ssd_capacity_blocks")
_REAL_FIELDS = (
    "kv_memory_fraction",
    "ttft_slo_s",
    "tpot_slo_s",
    "hit_price",
    "miss_price",
    "pair_retry_s",
)


@dataclass(frozen=True)
class SimConfig:
    """A cluster of ``num_instances`` identical instances (each ``num_gpus`` GPUs).

    With a disaggregated PD mode the first ``num_prefill`` instances prefill and the rest
    decode; colocated mode ignores ``num_prefill``. ``kv_capacity_tokens`` (per instance)
    defaults to what the cost model says fits in ``kv_memory_fraction`` of HBM;
    ``prefix_cache_blocks`` (per instance, LRU) defaults to the KV capacity in blocks.
    ``ssd_capacity_blocks`` > 0 enables the shared SSD tier. Prices are per input token.
    ``fast_forward`` runs each stretch of pure-decode steps of an instance as one event
    (cut short when new work arrives); False simulates every step as its own event.
    ``sample_interval_s`` spaces the KV-occupancy / queue-depth timeline samples (None:
    the trace duration / 200; 0: no timeline). ``autoscale`` switches instances on and off
    from observed SLO attainment (colocated only; ``num_instances`` is the most it may use).
    ``link_contention``: KV transfers and SSD reads into an instance share its link (one at
    a time, FIFO). ``instance_types`` makes a mixed pool (counts must add up to
    ``num_instances``; ``hardware``/``num_gpus`` then only name the default).
    ``cache_publish``: when a request's prompt blocks become prefix hits for later requests on
    its instance: ``"prefill"`` as soon as its prefill completes (vLLM's and SGLang's caches),
    ``"finish"`` when the request ends (deepinfer's engine saves a sequence's blocks then);
    with ``"finish"`` a queued request also looks its prefix up again when it is admitted to
    prefill, as that engine does.
    """

    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    num_instances: int = 8
    num_prefill: int = 0
    hardware: str = "h800"
    model: str = "dense-8b"
    num_gpus: int = 1
    kv_capacity_tokens: int | None = None
    kv_memory_fraction: float = 0.9
    prefix_cache_blocks: int | None = None
    ssd_capacity_blocks: int = 0
    spec: SpecDecodeConfig | None = None
    faults: tuple[Fault, ...] = ()
    ttft_slo_s: float = 2.0
    tpot_slo_s: float = 0.1
    hit_price: float = 0.1e-6
    miss_price: float = 5e-6
    pair_retry_s: float = 0.01
    fast_forward: bool = True
    sample_interval_s: float | None = None
    autoscale: AutoscaleConfig | None = None
    link_contention: bool = True
    cache_publish: str = "prefill"
    instance_types: tuple[InstanceType, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.scheduler, SchedulerConfig):
            raise TypeError("scheduler must be a SchedulerConfig")
        for name in _INT_FIELDS:
            check_int("SimConfig", name, getattr(self, name))
        for name in ("kv_capacity_tokens", "prefix_cache_blocks"):
            if getattr(self, name) is not None:
                check_int("SimConfig", name, getattr(self, name))
        for name in _REAL_FIELDS:
            check_real("SimConfig", name, getattr(self, name))
        check_bool("SimConfig", "fast_forward", self.fast_forward)
        check_bool("SimConfig", "link_contention", self.link_contention)
        if not isinstance(self.instance_types, tuple) or not all(
            isinstance(t, InstanceType) for t in self.instance_types
        ):
            raise TypeError("SimConfig.instance_types must be a tuple of InstanceType")
        if self.instance_types and sum(t.count for t in self.instance_types) != (
            self.num_instances
        ):
            raise ValueError(
                "SimConfig.instance_types counts must add up to num_instances "
                f"({self.num_instances}), got {sum(t.count for t in self.instance_types)}"
            )
        if self.autoscale is not None:
            if not isinstance(self.autoscale, AutoscaleConfig):
                raise TypeError("SimConfig.autoscale must be an AutoscaleConfig")
            if self.disaggregated:
                raise ValueError("SimConfig.autoscale needs pd='colocated'")
        if self.sample_interval_s is not None:
            check_real("SimConfig", "sample_interval_s", self.sample_interval_s)
            if self.sample_interval_s < 0:
                raise ValueError(
                    f"SimConfig.sample_interval_s must be >= 0, got {self.sample_interval_s}"
                )
        for name in ("hardware", "model"):
            if not isinstance(getattr(self, name), str):
                raise TypeError(f"SimConfig.{name} must be a string, got {getattr(self, name)!r}")
        if not 0.0 < self.kv_memory_fraction <= 1.0:
            raise ValueError(
                f"SimConfig.kv_memory_fraction must be in (0, 1], got {self.kv_memory_fraction}"
            )
        if self.hit_price < 0 or self.miss_price < 0:
            raise ValueError("SimConfig.hit_price and miss_price must be >= 0")
        if self.num_instances < 1:
            raise ValueError(f"num_instances must be >= 1, got {self.num_instances}")
        if self.disaggregated and not 1 <= self.num_prefill < self.num_instances:
            raise ValueError(
                f"pd={self.scheduler.pd!r} needs 1 <= num_prefill < num_instances "
                f"({self.num_instances}), got {self.num_prefill}"
            )
        if self.kv_capacity_tokens is not None and self.kv_capacity_tokens < 1:
            raise ValueError(f"kv_capacity_tokens must be >= 1, got {self.kv_capacity_tokens}")
        if self.prefix_cache_blocks is not None and self.prefix_cache_blocks < 0:
            raise ValueError("prefix_cache_blocks must be >= 0")
        if self.ssd_capacity_blocks < 0:
            raise ValueError("ssd_capacity_blocks must be >= 0")
        if self.cache_publish not in ("prefill", "finish"):
            raise ValueError(
                f"cache_publish must be 'prefill' or 'finish', got {self.cache_publish!r}"
            )
        if not (self.ttft_slo_s > 0 and self.tpot_slo_s > 0):
            raise ValueError("ttft_slo_s and tpot_slo_s must be > 0")
        if not self.pair_retry_s > 0:
            raise ValueError("pair_retry_s must be > 0")
        if not isinstance(self.faults, tuple):
            raise TypeError("faults must be a tuple of Fault")
        for f in self.faults:
            if f.instance_id >= self.num_instances:
                raise ValueError(
                    f"Fault.instance_id {f.instance_id} out of range [0, {self.num_instances})"
                )

    @property
    def disaggregated(self) -> bool:
        """True when the PD mode splits the cluster into prefill and decode pools."""
        return self.scheduler.pd != "colocated"

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SimConfig:
        """Build from JSON-like data (nested ``scheduler``, ``spec``, ``faults``)."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown SimConfig keys: {unknown}")
        kw = dict(data)
        if "scheduler" in kw:
            if not isinstance(kw["scheduler"], Mapping):
                raise TypeError(f"SimConfig.scheduler must be an object, got {kw['scheduler']!r}")
            kw["scheduler"] = SchedulerConfig.from_dict(kw["scheduler"])
        if kw.get("spec") is not None:
            if not isinstance(kw["spec"], Mapping):
                raise TypeError(f"SimConfig.spec must be an object, got {kw['spec']!r}")
            kw["spec"] = SpecDecodeConfig(**kw["spec"])
        if kw.get("autoscale") is not None:
            if not isinstance(kw["autoscale"], Mapping):
                raise TypeError(f"SimConfig.autoscale must be an object, got {kw['autoscale']!r}")
            unknown_a = sorted(set(kw["autoscale"]) - {f.name for f in fields(AutoscaleConfig)})
            if unknown_a:
                raise ValueError(f"unknown SimConfig.autoscale keys: {unknown_a}")
            kw["autoscale"] = AutoscaleConfig(**kw["autoscale"])
        if "instance_types" in kw:
            its = kw["instance_types"]
            if not isinstance(its, (list, tuple)) or not all(isinstance(t, Mapping) for t in its):
                raise TypeError("SimConfig.instance_types must be a list of objects")
            kw["instance_types"] = tuple(InstanceType(**t) for t in its)
        if "faults" in kw:
            if not isinstance(kw["faults"], (list, tuple)):
                raise TypeError(f"SimConfig.faults must be a list of objects, got {kw['faults']!r}")
            kw["faults"] = tuple(_fault(i, f) for i, f in enumerate(kw["faults"]))
        return cls(**kw)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict; ``from_dict(to_dict())`` round-trips."""
        d = asdict(self)
        d["scheduler"] = self.scheduler.to_dict()
        d["faults"] = [asdict(f) for f in self.faults]
        d["instance_types"] = [asdict(t) for t in self.instance_types]
        return d


def _fault(index: int, data: object) -> Fault:
    if not isinstance(data, Mapping) or set(data) != {"time_s", "instance_id"}:
        raise ValueError(
            f"SimConfig.faults[{index}] must be an object with keys time_s and instance_id, "
            f"got {data!r}"
        )
    return Fault(**data)
