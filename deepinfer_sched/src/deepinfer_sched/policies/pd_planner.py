"""P:D ratio planner: split a fixed number of instances between prefill and decode.

An analytic model checked against the simulator (``tests/deepinfer_sched/
test_pd_planner_vs_sim.py``: within 20% of the simulated sustainable load). Prefill
instances are M/G/1 queues whose TTFT must meet the SLO for an ``attainment`` share of
requests; decode instances run the largest batch whose step time (plus the KV transfer
spread over the output) meets the TPOT SLO.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

from deepinfer_sched.policies.base import CostModelLike
from deepinfer_sched.traces.types import Trace

__all__ = ["PDPlan", "WorkloadSummary", "plan_pd_ratio", "split_capacity"]


@dataclass(frozen=True)
class WorkloadSummary:
    """Means that drive the plan: request rate, uncached / cached prompt tokens, output, and
    ``uncached_scv``, the squared coefficient of variation (variance / mean^2) of the
    uncached tokens per request (0: all alike, an M/D/1 prefill queue)."""

    request_rate: float
    mean_uncached_tokens: float
    mean_cached_tokens: float
    mean_output_len: float
    uncached_scv: float = 0.0

    def __post_init__(self) -> None:
        if not (self.uncached_scv >= 0 and math.isfinite(self.uncached_scv)):
            raise ValueError(f"uncached_scv must be finite and >= 0, got {self.uncached_scv}")
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
        lens = [r.input_len for r in trace]
        mean = sum(lens) / len(lens)
        var = sum((x - mean) ** 2 for x in lens) / len(lens)
        scv = var / (mean * mean) if mean > 0 else 0.0
        return cls(st.request_rate, st.mean_input_len - cached, cached, st.mean_output_len, scv)


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


def _service_quantile(mean: float, scv: float, p: float) -> float:
    """The ``p`` quantile of a gamma law with this mean and squared CV (Wilson-Hilferty
    approximation; the mean itself when ``scv`` is 0)."""
    if scv <= 0:
        return mean
    k = 1.0 / scv
    z = NormalDist().inv_cdf(min(max(p, 1e-12), 1 - 1e-12))
    c = 1.0 / (9.0 * k)
    return mean * max(0.0, 1.0 - c + z * math.sqrt(c)) ** 3


def _erlang_c(c: int, a: float) -> float:
    """Probability that an arrival waits in an M/M/c queue with offered load ``a = lam s``."""
    if a >= c:
        return 1.0
    term = 1.0
    total = 1.0
    for k in range(1, c):
        term *= a / k
        total += term
    last = term * a / c / (1.0 - a / c)
    return last / (total + last)


def _prefill_pool_rate(
    w: WorkloadSummary, cm: CostModelLike, ttft_slo_s: float, attainment: float, c: int
) -> float:
    """Largest arrival rate at which a pool of ``c`` prefill instances meets the TTFT SLO for
    an ``attainment`` share of requests.

    The pool is an M/G/c queue (a load-aware router approximates one shared queue). Service
    ``S`` is gamma with mean ``s = prefill_time(mean uncached, mean cached)`` and the
    workload's squared CV. An arrival waits with the Erlang-C probability, and a wait is
    exponential with rate ``(c / s - lam) 2 / (1 + scv)`` (exact for M/M/c; the factor is
    the Allen-Cunneen correction for general service). ``P(S + W > SLO)`` is integrated
    over 128 quantiles of ``S``. TTFT ends with the prefill (the KV transfer to the decode
    instance counts in TPOT, as in the simulator).
    """
    s = cm.prefill_time(round(w.mean_uncached_tokens), round(w.mean_cached_tokens))
    if s <= 0:
        return float("inf")
    miss = 1.0 - attainment
    n = 128
    qs = [_service_quantile(s, w.uncached_scv, (i + 0.5) / n) for i in range(n)]

    def meets(lam: float) -> bool:
        a = lam * s
        if a >= c:
            return False
        p_wait = _erlang_c(c, a)
        theta = (c / s - lam) * 2.0 / (1.0 + w.uncached_scv)
        late = 0.0
        for x in qs:
            budget = ttft_slo_s - x
            late += 1.0 if budget < 0 else p_wait * math.exp(-theta * budget)
        return late / n <= miss

    if not meets(1e-12 / s):
        return 0.0
    lo, hi = 0.0, c / s
    for _ in range(60):
        mid = (lo + hi) / 2.0
        if meets(mid):
            lo = mid
        else:
            hi = mid
    return lo


def _decode_rate_per_instance(
    w: WorkloadSummary, cm: CostModelLike, tpot_slo_s: float, kv_capacity_tokens: int
) -> float:
    """Requests/s one decode instance sustains: the largest batch b whose step time over a
    mean context (prompt + half the output), plus the KV transfer spread over the output
    (TPOT counts from the first token, emitted before the transfer), meets the TPOT SLO and
    fits the KV capacity, each request holding a slot for ``mean_output_len`` steps."""
    ctx = w.mean_uncached_tokens + w.mean_cached_tokens + w.mean_output_len / 2.0
    prompt = round(w.mean_uncached_tokens + w.mean_cached_tokens)
    transfer = cm.kv_transfer_time(prompt) / max(1.0, w.mean_output_len - 1.0)
    best = 0.0
    b = 1
    while b * ctx <= kv_capacity_tokens:
        step = cm.decode_step_time(b, round(b * ctx))
        if step + transfer > tpot_slo_s:
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
    attainment: float = 0.9,
) -> PDPlan:
    """The split of ``total_instances`` (at least one of each role) maximising the request
    rate both pools sustain with ``attainment`` of requests within the TTFT SLO; ties go
    to fewer prefill instances."""
    if total_instances < 2:
        raise ValueError(f"total_instances must be >= 2 to split, got {total_instances}")
    if not (ttft_slo_s > 0 and tpot_slo_s > 0):
        raise ValueError("ttft_slo_s and tpot_slo_s must be > 0")
    if not 0.0 < attainment < 1.0:
        raise ValueError(f"attainment must be in (0, 1), got {attainment}")
    d_rate = _decode_rate_per_instance(workload, cost_model, tpot_slo_s, kv_capacity_tokens)
    best: PDPlan | None = None
    for p in range(1, total_instances):
        p_rate = _prefill_pool_rate(workload, cost_model, ttft_slo_s, attainment, p)
        plan = PDPlan(p, total_instances - p, p_rate, (total_instances - p) * d_rate)
        if best is None or plan.capacity_rps > best.capacity_rps:
            best = plan
    assert best is not None
    return best


def split_capacity(
    workload: WorkloadSummary,
    cost_model: CostModelLike,
    num_prefill: int,
    num_decode: int,
    ttft_slo_s: float,
    tpot_slo_s: float,
    kv_capacity_tokens: int,
    attainment: float = 0.9,
) -> PDPlan:
    """The planner's capacities for one given split (what :func:`plan_pd_ratio` compares)."""
    if num_prefill < 1 or num_decode < 1:
        raise ValueError(f"need num_prefill, num_decode >= 1, got {num_prefill}, {num_decode}")
    if not 0.0 < attainment < 1.0:
        raise ValueError(f"attainment must be in (0, 1), got {attainment}")
    p = _prefill_pool_rate(workload, cost_model, ttft_slo_s, attainment, num_prefill)
    d = _decode_rate_per_instance(workload, cost_model, tpot_slo_s, kv_capacity_tokens)
    return PDPlan(num_prefill, num_decode, p, num_decode * d)
