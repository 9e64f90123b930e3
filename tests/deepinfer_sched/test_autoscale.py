"""SLO-driven autoscaling: the policy's decisions, and a simulated daily swing where it
serves the same attainment as a fixed fleet with fewer instance-hours."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from deepinfer_sched.costmodel import RooflineCostModel, load_hardware, load_model
from deepinfer_sched.policies import AutoscaleConfig, SchedulerConfig, SLOAutoscaler
from deepinfer_sched.report import SLO
from deepinfer_sched.sim import SimConfig, SimResult, run_simulation
from deepinfer_sched.traces import Trace, TraceRequest, daily_swing

CM = RooflineCostModel(load_hardware("h800"), load_model("dense-8b"))
TTFT, TPOT = 1.0, 0.03


def test_decisions_follow_attainment_with_a_cooldown() -> None:
    s = SLOAutoscaler(AutoscaleConfig(cooldown_s=60, down_cooldown_s=120), 8, TTFT)
    assert s.decide(0.0, met=80, total=100, oldest_wait_s=0.0, active=2) == 1
    assert s.decide(30.0, met=0, total=100, oldest_wait_s=9.0, active=3) == 0  # cooldown
    assert s.decide(61.0, met=50, total=100, oldest_wait_s=0.0, active=3) == 2  # far below
    assert s.decide(130.0, met=100, total=100, oldest_wait_s=0.0, active=5) == 0  # < 120 s
    assert s.decide(190.0, met=100, total=100, oldest_wait_s=0.0, active=5) == -1
    assert s.decide(400.0, met=96, total=100, oldest_wait_s=0.0, active=4) == 0  # hysteresis
    assert s.decide(500.0, met=100, total=100, oldest_wait_s=0.8, active=4) == 0  # queue
    assert s.decide(600.0, met=100, total=100, oldest_wait_s=2.0, active=4) == 1  # late
    assert s.decide(700.0, met=0, total=10, oldest_wait_s=0.0, active=8) == 0  # at max
    f = SLOAutoscaler(AutoscaleConfig(capacity_rps=2.0, down_cooldown_s=0), 8, TTFT)
    assert f.decide(0.0, met=10, total=10, oldest_wait_s=0.0, active=2, arrival_rps=7.0) == 2
    assert f.decide(100.0, met=10, total=10, oldest_wait_s=0.0, active=4, arrival_rps=5.0) == 0
    assert f.decide(200.0, met=10, total=10, oldest_wait_s=0.0, active=4, arrival_rps=4.0) == -1


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"target": 0.99, "scale_down_at": 0.9}, "target <= scale_down_at"),
        ({"min_instances": 0}, "min_instances"),
        ({"max_instances": 2, "initial": 3}, "initial"),
        ({"cooldown_s": -1.0}, "cooldown_s"),
        ({"step": "2"}, r"AutoscaleConfig\.step"),
        ({"capacity_rps": 0.0}, "capacity_rps"),
    ],
)
def test_bad_autoscale_configs_name_the_field(kw: dict[str, object], match: str) -> None:
    with pytest.raises((TypeError, ValueError), match=match):
        AutoscaleConfig(**kw)  # type: ignore[arg-type]


def test_autoscale_needs_colocated_and_round_trips() -> None:
    with pytest.raises(ValueError, match="colocated"):
        SimConfig(SchedulerConfig(pd="disaggregated"), num_prefill=1, autoscale=AutoscaleConfig())
    cfg = SimConfig(autoscale=AutoscaleConfig(initial=2, capacity_rps=3.0))
    assert SimConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ValueError, match="autoscale keys"):
        SimConfig.from_dict({"autoscale": {"taget": 0.9}})


def swing_trace(n: int, rate: float, day_s: float, amplitude: float) -> Trace:
    rng = np.random.default_rng(0)
    t = daily_swing(np.cumsum(rng.exponential(1.0 / rate, n)), day_s, amplitude, -np.pi / 2)
    inp = np.clip(rng.lognormal(np.log(3000), 0.5, n), 64, 30_000).astype(int)
    out = np.clip(rng.lognormal(np.log(300), 0.5, n), 2, 3000).astype(int)
    return Trace(
        tuple(TraceRequest(i, float(t[i]), int(inp[i]), int(out[i]), ()) for i in range(n)), 512
    )


def _run(trace: Trace, n: int, auto: AutoscaleConfig | None) -> SimResult:
    cfg = SimConfig(
        SchedulerConfig(router="least_loaded"),
        num_instances=n,
        ttft_slo_s=TTFT,
        tpot_slo_s=TPOT,
        autoscale=auto,
        sample_interval_s=0.0,
    )
    return run_simulation(trace, cfg, 0, cost_model=CM)


def test_daily_swing_autoscaling_saves_instance_hours_at_the_same_attainment() -> None:
    trace = swing_trace(4500, 5.0, 900.0, 0.8)  # peak 9 req/s, trough 1 req/s
    auto = AutoscaleConfig(
        window_s=60, interval_s=15, cooldown_s=45, startup_s=20, initial=2, capacity_rps=3.2
    )
    slo = SLO(TTFT, TPOT)
    scaled = _run(trace, 4, auto)
    att = scaled.report(slo, 1.0, 1.0).slo_attainment
    assert att >= 0.95
    sizes = [n for _, n in scaled.fleet_size]
    assert min(sizes) == 1 and max(sizes) >= 3  # follows the swing
    times = [t for t, _ in scaled.fleet_size[1:]]
    assert all(b - a >= 45.0 for a, b in itertools.pairwise(times))
    # The smallest fixed fleet reaching the autoscaled attainment costs more.
    fixed = None
    for n in (1, 2, 3, 4):
        res = _run(trace, n, None)
        if res.report(slo, 1.0, 1.0).slo_attainment >= att:
            fixed = res
            break
    assert fixed is not None
    assert scaled.instance_seconds < 0.9 * fixed.instance_seconds
    assert fixed.instance_seconds == pytest.approx(n * (fixed.duration_s), rel=0.01)
