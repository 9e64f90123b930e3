"""Scheduler configuration: a validated dataclass (or a plain dict) -> composed policies."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from deepinfer_sched._checks import check_int, check_real
from deepinfer_sched.policies.admission_rate_limit import RateLimit, TenantRateLimiter
from deepinfer_sched.policies.admission_ttft import TTFTAdmission
from deepinfer_sched.policies.base import (
    AdmissionPolicy,
    CostModelLike,
    DecodePairing,
    MigrationPolicy,
    PDPolicy,
    Router,
)
from deepinfer_sched.policies.batch import BatchConfig
from deepinfer_sched.policies.cost import CostRouter
from deepinfer_sched.policies.least_loaded import LeastLoadedRouter
from deepinfer_sched.policies.migration import ThresholdMigration
from deepinfer_sched.policies.pairing import LeastLoadedPairing
from deepinfer_sched.policies.pd_colocated import ColocatedPD
from deepinfer_sched.policies.pd_disaggregated import DisaggregatedPD
from deepinfer_sched.policies.pd_per_request import PerRequestPD
from deepinfer_sched.policies.power_of_two import PowerOfTwoRouter
from deepinfer_sched.policies.prefix_affinity import PrefixAffinityRouter
from deepinfer_sched.policies.round_robin import RoundRobinRouter
from deepinfer_sched.policies.ttft_estimate import TTFTEstimateRouter

__all__ = ["ADMISSIONS", "PD_MODES", "ROUTERS", "Policies", "SchedulerConfig"]

ROUTERS = (
    "round_robin",
    "least_loaded",
    "power_of_two",
    "prefix_affinity",
    "cost",
    "ttft_estimate",
)
PD_MODES = ("colocated", "disaggregated", "per_request")
ADMISSIONS = ("ttft", "rate_limit")
MIGRATIONS = ("none", "threshold")


@dataclass(frozen=True)
class Policies:
    """The composed policy objects one simulation (or one gateway) runs with."""

    router: Router
    pd: PDPolicy
    pairing: DecodePairing
    admission: tuple[AdmissionPolicy, ...]
    migration: MigrationPolicy | None
    batch: BatchConfig


@dataclass(frozen=True)
class SchedulerConfig:
    """Which policy fills each seam, and its knobs.

    ``router`` one of :data:`ROUTERS`; ``pd`` one of :data:`PD_MODES`; ``admission`` a
    tuple drawn from :data:`ADMISSIONS` (``ttft`` needs ``ttft_slo_s``); ``migration`` is
    ``none`` or ``threshold``. ``rate_limits`` maps tenant -> (tokens/s, burst tokens).
    """

    router: str = "least_loaded"
    load_cutoff: float = 2.0
    prefill_weight: float = 4.0
    router_seed: int = 0
    pd: str = "colocated"
    local_prefill_tokens: int = 512
    pairing_headroom: float = 0.0
    batch: BatchConfig = field(default_factory=BatchConfig)
    admission: tuple[str, ...] = ()
    ttft_slo_s: float | None = None
    ttft_slack: float = 1.0
    rate_limits: Mapping[str, tuple[float, float]] = field(default_factory=dict)
    default_rate_limit: tuple[float, float] | None = None
    migration: str = "none"
    migration_threshold: float = 1.5
    migration_interval_s: float = 1.0

    def __post_init__(self) -> None:
        for name in ("router", "pd", "migration"):
            if not isinstance(getattr(self, name), str):
                raise TypeError(
                    f"SchedulerConfig.{name} must be a string, got {getattr(self, name)!r}"
                )
        for name in ("router_seed", "local_prefill_tokens"):
            check_int("SchedulerConfig", name, getattr(self, name))
        for name in (
            "load_cutoff",
            "prefill_weight",
            "pairing_headroom",
            "ttft_slack",
            "migration_threshold",
            "migration_interval_s",
        ):
            check_real("SchedulerConfig", name, getattr(self, name))
        if self.ttft_slo_s is not None:
            check_real("SchedulerConfig", "ttft_slo_s", self.ttft_slo_s)
        if self.router not in ROUTERS:
            raise ValueError(f"router must be one of {ROUTERS}, got {self.router!r}")
        if self.pd not in PD_MODES:
            raise ValueError(f"pd must be one of {PD_MODES}, got {self.pd!r}")
        if self.migration not in MIGRATIONS:
            raise ValueError(f"migration must be one of {MIGRATIONS}, got {self.migration!r}")
        if not isinstance(self.batch, BatchConfig):
            raise TypeError(f"batch must be a BatchConfig, got {type(self.batch).__name__}")
        if not isinstance(self.admission, tuple):
            raise TypeError("admission must be a tuple of names")
        for a in self.admission:
            if a not in ADMISSIONS:
                raise ValueError(f"admission entries must be in {ADMISSIONS}, got {a!r}")
        if "ttft" in self.admission and not (self.ttft_slo_s and self.ttft_slo_s > 0):
            raise ValueError("admission 'ttft' needs ttft_slo_s > 0")
        # Construct every knob's policy once so bad values fail here, not mid-run.
        CostRouter(self.prefill_weight)
        PrefixAffinityRouter(self.load_cutoff)
        PerRequestPD(self.local_prefill_tokens)
        LeastLoadedPairing(self.pairing_headroom)
        ThresholdMigration(self.migration_threshold, self.migration_interval_s)
        self._build_static()

    def _build_static(self) -> tuple[Router | None, PDPolicy, tuple[AdmissionPolicy, ...]]:
        router: Router | None = None
        if self.router == "round_robin":
            router = RoundRobinRouter()
        elif self.router == "least_loaded":
            router = LeastLoadedRouter()
        elif self.router == "power_of_two":
            router = PowerOfTwoRouter(self.router_seed)
        elif self.router == "prefix_affinity":
            router = PrefixAffinityRouter(self.load_cutoff)
        elif self.router == "cost":
            router = CostRouter(self.prefill_weight)
        pd: PDPolicy
        if self.pd == "colocated":
            pd = ColocatedPD()
        elif self.pd == "disaggregated":
            pd = DisaggregatedPD()
        else:
            pd = PerRequestPD(self.local_prefill_tokens)
        adm: list[AdmissionPolicy] = []
        for a in self.admission:
            if a == "ttft":
                assert self.ttft_slo_s is not None
                adm.append(TTFTAdmission(self.ttft_slo_s, self.ttft_slack))
            else:
                limits = {t: RateLimit(*v) for t, v in self.rate_limits.items()}
                dflt = RateLimit(*self.default_rate_limit) if self.default_rate_limit else None
                adm.append(TenantRateLimiter(limits, dflt))
        return router, pd, tuple(adm)

    def build(self, cost_model: CostModelLike) -> Policies:
        """Fresh policy objects (stateful ones start from scratch on every call)."""
        router, pd, adm = self._build_static()
        if router is None:
            router = TTFTEstimateRouter(
                cost_model, transfer_to_decode=pd.disaggregated, seed=self.router_seed
            )
        migration = (
            ThresholdMigration(self.migration_threshold, self.migration_interval_s)
            if self.migration == "threshold"
            else None
        )
        pairing = LeastLoadedPairing(self.pairing_headroom)
        return Policies(router, pd, pairing, adm, migration, self.batch)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SchedulerConfig:
        """Build from JSON-like data; unknown keys raise ValueError naming them."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown SchedulerConfig keys: {unknown}")
        kw = dict(data)
        if "batch" in kw:
            if not isinstance(kw["batch"], Mapping):
                raise TypeError(f"SchedulerConfig.batch must be an object, got {kw['batch']!r}")
            unknown = sorted(set(kw["batch"]) - {f.name for f in fields(BatchConfig)})
            if unknown:
                raise ValueError(f"unknown SchedulerConfig.batch keys: {unknown}")
            kw["batch"] = BatchConfig(**kw["batch"])
        if "admission" in kw:
            adm = kw["admission"]
            if not isinstance(adm, (list, tuple)):
                # tuple("ttft") would be ('t', 't', 'f', 't'): name the field instead.
                raise TypeError(
                    f"SchedulerConfig.admission must be a list of names from {ADMISSIONS}, "
                    f"got {adm!r} (write [{adm!r}] for one policy)"
                )
            kw["admission"] = tuple(adm)
        if "rate_limits" in kw:
            if not isinstance(kw["rate_limits"], Mapping):
                raise TypeError("SchedulerConfig.rate_limits must map tenant -> [rate, burst]")
            kw["rate_limits"] = {
                str(k): _pair(f"rate_limits[{k!r}]", v) for k, v in kw["rate_limits"].items()
            }
        if kw.get("default_rate_limit") is not None:
            kw["default_rate_limit"] = _pair("default_rate_limit", kw["default_rate_limit"])
        return cls(**kw)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict; ``from_dict(to_dict())`` round-trips."""
        d = asdict(self)
        d["admission"] = list(self.admission)
        d["rate_limits"] = {k: list(v) for k, v in self.rate_limits.items()}
        if self.default_rate_limit is not None:
            d["default_rate_limit"] = list(self.default_rate_limit)
        return d


def _pair(name: str, value: object) -> tuple[float, float]:
    """A JSON ``[tokens_per_s, burst_tokens]`` pair of numbers."""
    if not isinstance(value, (list, tuple)) or len(value) != 2:
        raise TypeError(
            f"SchedulerConfig.{name} must be [tokens_per_s, burst_tokens], got {value!r}"
        )
    for v in value:
        check_real("SchedulerConfig", name, v)
    return (float(value[0]), float(value[1]))
