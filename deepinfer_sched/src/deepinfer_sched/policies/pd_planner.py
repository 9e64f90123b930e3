"""P:D ratio planner: split a fixed number of instances between prefill and decode.

An analytic first cut (the simulator then checks the chosen split): prefill instances are
M/D/1 queues and decode instances run the largest batch whose step time meets the TPOT SLO.
"""

from __future__ import annotations

from dataclasses import dataclass

from deepinfer_sched.policies.base import CostModelLike
from deepinfer_sched.traces.types import Trace

__all__ = ["PDPlan", "WorkloadSummary", "plan_pd_ratio"]


@dataclass(frozen=True)
class WorkloadSummary:
    """Means that drive the plan: request rate, uncached / cached prompt tokens, output."""

    request_rate: float
    mean_uncached_tokens: float
    mean_cached_tokens: float
    mean_output_len: float

    def __post_init__(self) -> None:
        if not self.request_rate > 0:
            raise ValueError(f"request_rate must be > 0, got {self.request_rate}")
        if self.mean_uncached_tokens < 0 or self.mean_cached_tokens < 0:
            raise ValueError("mean_uncached_tokens and mean_cached_tokens must be >= 0")
        if not self.mean_output_len >= 1:
            raise ValueError(f"mean_output_len must be >= 1, got {self.mean_output_len}")

    @classmethod
    def from_trace(cls, trace: Trace, hit_rate: float | None = None) -> WorkloadSummary:
        """Means of ``trace``. The cached share is ``hit_rate`` when given (e.g. measured in
        a simulation), else the trace's reusable fraction, the upper bound a prefix cache
        can reach: under load the realised hit rate is lower (a follow-up turn that arrives
        before its predecessor's prefill finished misses), so the upper bound
        under-provisions prefill."""
        st = trace.stats()
        if st.request_rate <= 0:
            raise ValueError("trace must span a positive duration to have a request rate")
        if hit_rate is not None and not 0.0 <= hit_rate <= 1.0:
            raise ValueError(f"hit_rate must be in [0, 1], got {hit_rate}")
        share = st.reusable_fraction if hit_rate is None else hit_rate
        cached = st.mean_input_len * share
        return cls(st.request_rate, st.mean_input_len - cached, cached, st.mean_output_len)


@dataclass(frozen=True)
class PDPlan:
    """The chosen split and the per-pool request rates that still meet the SLO."""

    num_prefill: int
    num_decode: int
    prefill_capacity_rps: float
    decode_capacity_rps: float

    @property
    def capacity_rps(self) -> float:
        """Sustainable request rate under the SLO: the tighter of the two pools."""
        return min(self.prefill_capacity_rps, self.decode_capacity_rps)


def _prefill_rate_per_instance(
    w: WorkloadSummary, cm: CostModelLike, ttft_slo_s: float, transfer: bool
) -> float:
    """Largest arrival rate at which an M/D/1 prefill queue meets the TTFT SLO on average.

    TTFT = s + rho s / (2 (1 - rho)) [+ transfer], with s the prefill time and rho = lam s.
    """
    s = cm.prefill_time(round(w.mean_uncached_tokens), round(w.mean_cached_tokens))
    budget = ttft_slo_s - s
    if transfer:
        budget -= cm.kv_transfer_time(round(w.mean_uncached_tokens + w.mean_cached_tokens))
    if budget <= 0 or s <= 0:
        return 0.0 if s > 0 else float("inf")
    # rho s / (2 (1 - rho)) <= budget  <=>  rho <= 2 budget / (s + 2 budget)
    rho = 2.0 * budget / (s + 2.0 * budget)
    return rho / s


def _decode_rate_per_instance(
    w: WorkloadSummary, cm: CostModelLike, tpot_slo_s: float, kv_capacity_tokens: int
) -> float:
    """Requests/s one decode instance sustains: the largest batch b whose step time over a
    mean context (prompt + half the output) meets the TPOT SLO and fits the KV capacity,
    each request holding a slot for ``mean_output_len`` steps."""
    ctx = w.mean_uncached_tokens + w.mean_cached_tokens + w.mean_output_len / 2.0
    best = 0.0
    b = 1
    while b * ctx <= kv_capacity_tokens:
        step = cm.decode_step_time(b, round(b * ctx))
        if step > tpot_slo_s:
            break
        best = b / (step * w.mean_output_len)
        b = b + 1 if b < 16 else int(b * 1.25)
    return best


def plan_pd_ratio(
    workload: WorkloadSummary,
    cost_model: CostModelLike,
    total_instances: int,
    ttft_slo_s: float,
    tpot_slo_s: float,
    kv_capacity_tokens: int,
) -> PDPlan:
    """The split of ``total_instances`` (at least one of each role) maximising the request
    rate both pools sustain under the SLO; ties go to fewer prefill instances."""
    if total_instances < 2:
        raise ValueError(f"total_instances must be >= 2 to split, got {total_instances}")
    if not (ttft_slo_s > 0 and tpot_slo_s > 0):
        raise ValueError("ttft_slo_s and tpot_slo_s must be > 0")
    p_rate = _prefill_rate_per_instance(workload, cost_model, ttft_slo_s, True)
    d_rate = _decode_rate_per_instance(workload, cost_model, tpot_slo_s, kv_capacity_tokens)
    best: PDPlan | None = None
    for p in range(1, total_instances):
        plan = PDPlan(p, total_instances - p, p * p_rate, (total_instances - p) * d_rate)
        if best is None or plan.capacity_rps > best.capacity_rps:
            best = plan
    assert best is not None
    return best
