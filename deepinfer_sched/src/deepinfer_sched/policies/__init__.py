"""Composable scheduling policies: routers, PD modes, batching, admission, migration."""

from deepinfer_sched.policies.admission_rate_limit import RateLimit, TenantRateLimiter
from deepinfer_sched.policies.admission_ttft import TTFTAdmission
from deepinfer_sched.policies.autoscale import AutoscaleConfig, SLOAutoscaler
from deepinfer_sched.policies.base import (
    AdmissionPolicy,
    CostModelLike,
    DecodePairing,
    InstanceView,
    MigrationMove,
    MigrationPolicy,
    PDPolicy,
    RequestView,
    Router,
)
from deepinfer_sched.policies.batch import BatchConfig, BatchPlan, ContinuousBatchPolicy, SeqState
from deepinfer_sched.policies.config import ADMISSIONS, PD_MODES, ROUTERS, Policies, SchedulerConfig
from deepinfer_sched.policies.cost import CostRouter, routing_cost
from deepinfer_sched.policies.least_loaded import LeastLoadedRouter
from deepinfer_sched.policies.migration import ThresholdMigration
from deepinfer_sched.policies.pairing import LeastLoadedPairing
from deepinfer_sched.policies.pd_colocated import ColocatedPD
from deepinfer_sched.policies.pd_disaggregated import DisaggregatedPD
from deepinfer_sched.policies.pd_per_request import PerRequestPD
from deepinfer_sched.policies.pd_planner import (
    PDPlan,
    WorkloadSummary,
    plan_pd_ratio,
    split_capacity,
)
from deepinfer_sched.policies.power_of_two import PowerOfTwoRouter
from deepinfer_sched.policies.prefix_affinity import PrefixAffinityRouter
from deepinfer_sched.policies.round_robin import RoundRobinRouter
from deepinfer_sched.policies.ttft_estimate import TTFTEstimateRouter, estimate_ttft

__all__ = [
    "ADMISSIONS",
    "PD_MODES",
    "ROUTERS",
    "AdmissionPolicy",
    "AutoscaleConfig",
    "BatchConfig",
    "BatchPlan",
    "ColocatedPD",
    "ContinuousBatchPolicy",
    "CostModelLike",
    "CostRouter",
    "DecodePairing",
    "DisaggregatedPD",
    "InstanceView",
    "LeastLoadedPairing",
    "LeastLoadedRouter",
    "MigrationMove",
    "MigrationPolicy",
    "PDPlan",
    "PDPolicy",
    "PerRequestPD",
    "Policies",
    "PowerOfTwoRouter",
    "PrefixAffinityRouter",
    "RateLimit",
    "RequestView",
    "RoundRobinRouter",
    "Router",
    "SLOAutoscaler",
    "SchedulerConfig",
    "SeqState",
    "TTFTAdmission",
    "TTFTEstimateRouter",
    "TenantRateLimiter",
    "ThresholdMigration",
    "WorkloadSummary",
    "estimate_ttft",
    "plan_pd_ratio",
    "routing_cost",
    "split_capacity",
]
