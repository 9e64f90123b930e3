"""The P:D planner's sustainable load agrees with the simulator's within 20%."""

from __future__ import annotations

import numpy as np
import pytest

from deepinfer_sched.costmodel import RooflineCostModel, load_hardware, load_model
from deepinfer_sched.policies import (
    SchedulerConfig,
    WorkloadSummary,
    plan_pd_ratio,
    split_capacity,
)
from deepinfer_sched.report import SLO
from deepinfer_sched.sim import SimConfig, run_simulation
from deepinfer_sched.traces import Trace, TraceRequest

CM = RooflineCostModel(load_hardware("h800"), load_model("dense-8b"))
TTFT, TPOT, TARGET = 0.5, 0.02, 0.9


def poisson_trace(rate: float, n: int = 1500, seed: int = 0) -> Trace:
    """Poisson arrivals; lognormal prompts (median 3000) and outputs (median 300); no reuse."""
    rng = np.random.default_rng(seed)
    t = np.cumsum(rng.exponential(1.0 / rate, n))
    inp = np.clip(rng.lognormal(np.log(3000), 0.5, n), 64, 30_000).astype(int)
    out = np.clip(rng.lognormal(np.log(300), 0.5, n), 2, 3000).astype(int)
    reqs = (TraceRequest(i, float(t[i]), int(inp[i]), int(out[i]), ()) for i in range(n))
    return Trace(tuple(reqs), 512)


def attainment(rate: float, num_prefill: int) -> float:
    cfg = SimConfig(
        SchedulerConfig(router="least_loaded", pd="disaggregated"),
        num_instances=4,
        num_prefill=num_prefill,
        ttft_slo_s=TTFT,
        tpot_slo_s=TPOT,
    )
    res = run_simulation(poisson_trace(rate), cfg, 0, cost_model=CM)
    return res.report(SLO(TTFT, TPOT), 1.0, 1.0).slo_attainment


@pytest.mark.parametrize("num_prefill", [1, 3])  # prefill-bound, decode-bound
def test_planned_capacity_is_within_20_percent_of_the_simulated_one(num_prefill: int) -> None:
    work = WorkloadSummary.from_trace(poisson_trace(10.0, n=4000, seed=1), hit_rate=0.0)
    kv = CM.kv_capacity_tokens(0.9)
    plan = split_capacity(work, CM, num_prefill, 4 - num_prefill, TTFT, TPOT, kv, TARGET)
    predicted = plan.capacity_rps
    # The simulated sustainable load (attainment >= 0.9) lies within +-20% of it.
    assert attainment(0.8 * predicted, num_prefill) >= TARGET
    assert attainment(1.2 * predicted, num_prefill) < TARGET


def test_the_planner_picks_the_split_that_sustains_the_most() -> None:
    work = WorkloadSummary.from_trace(poisson_trace(10.0, n=4000, seed=1), hit_rate=0.0)
    kv = CM.kv_capacity_tokens(0.9)
    best = plan_pd_ratio(work, CM, 4, TTFT, TPOT, kv, attainment=TARGET)
    others = [split_capacity(work, CM, p, 4 - p, TTFT, TPOT, kv, TARGET) for p in (1, 2, 3)]
    assert best.capacity_rps == max(o.capacity_rps for o in others)
    assert best.num_prefill == 2  # pooled prefill (M/G/2) beats one prefill or one decode
    # A stricter attainment target lowers the prefill pool's capacity.
    strict = split_capacity(work, CM, 2, 2, TTFT, TPOT, kv, 0.99)
    assert strict.prefill_capacity_rps < others[1].prefill_capacity_rps
    with pytest.raises(ValueError, match="attainment"):
        split_capacity(work, CM, 2, 2, TTFT, TPOT, kv, 1.0)
