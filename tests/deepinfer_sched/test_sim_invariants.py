"""Simulator: every request accounted for exactly once, determinism, faults."""

from __future__ import annotations

import math

from _sim_traces import small_trace
from hypothesis import given, settings
from hypothesis import strategies as st

from deepinfer_sched.policies import PD_MODES, ROUTERS, BatchConfig, SchedulerConfig
from deepinfer_sched.sim import Fault, SimConfig, SpecDecodeConfig, run_simulation, simulate


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[SimConfig, int, float, int]:
    n_inst = draw(st.integers(1, 5))
    pd = draw(st.sampled_from(PD_MODES)) if n_inst >= 2 else "colocated"
    admission: tuple[str, ...] = tuple(
        a for a in ("ttft", "rate_limit") if draw(st.booleans()) and draw(st.booleans())
    )
    sched = SchedulerConfig(
        router=draw(st.sampled_from(ROUTERS)),
        pd=pd,
        local_prefill_tokens=draw(st.sampled_from([0, 64, 400])),
        batch=BatchConfig(
            max_num_seqs=draw(st.integers(1, 16)),
            max_batched_tokens=draw(st.sampled_from([64, 256, 2048])),
            chunked_prefill=draw(st.booleans()),
        ),
        admission=admission,
        ttft_slo_s=0.5,
        default_rate_limit=(20_000.0, 5_000.0),
        migration=draw(st.sampled_from(["none", "threshold"])),
        migration_interval_s=0.2,
    )
    faults = tuple(
        Fault(draw(st.floats(0.0, 3.0)), draw(st.integers(0, n_inst - 1)))
        for _ in range(draw(st.integers(0, 3)))
    )
    spec = draw(
        st.sampled_from(
            [
                None,
                SpecDecodeConfig(gamma=3, alpha=0.6),
                SpecDecodeConfig(gamma=2, alpha=0.5, acceptance="fixed"),
            ]
        )
    )
    cfg = SimConfig(
        scheduler=sched,
        num_instances=n_inst,
        num_prefill=draw(st.integers(1, n_inst - 1)) if pd != "colocated" else 0,
        kv_capacity_tokens=draw(st.sampled_from([700, 3000, 50_000])),
        prefix_cache_blocks=draw(st.sampled_from([0, 8, 1000])),
        ssd_capacity_blocks=draw(st.sampled_from([0, 50])),
        spec=spec,
        faults=faults,
        fast_forward=draw(st.booleans()),
    )
    return (
        cfg,
        draw(st.integers(5, 60)),
        draw(st.sampled_from([2.0, 20.0, 200.0])),
        draw(st.integers(0, 3)),
    )


@settings(max_examples=100)
@given(scenarios())
def test_every_request_finishes_or_is_rejected_exactly_once(
    sc: tuple[SimConfig, int, float, int],
) -> None:
    cfg, n, rate, seed = sc
    trace = small_trace(n, rate, seed=seed, priorities=2)
    res = run_simulation(trace, cfg, seed)
    assert [r.request_id for r in res.records] == [r.request_id for r in trace]
    dead: dict[int, float] = {}
    for f in cfg.faults:
        dead[f.instance_id] = min(f.time_s, dead.get(f.instance_id, math.inf))
    for rec, req in zip(res.records, trace, strict=True):
        assert rec.input_len == req.input_len and rec.output_len == req.output_len
        if rec.rejected:
            continue
        assert req.arrival_s <= rec.first_token_s <= rec.finish_s < math.inf
        # Nothing completes on an instance after it died.
        if rec.decode_instance in dead:
            assert rec.finish_s <= dead[rec.decode_instance]
    reasons = set(res.rejections)
    assert sum(res.rejections.values()) == sum(r.rejected for r in res.records)
    if not cfg.scheduler.admission and not cfg.faults:
        assert reasons <= {"too_long"}
    if cfg.kv_capacity_tokens and cfg.kv_capacity_tokens >= 3000 and not cfg.faults:
        assert "too_long" not in reasons


@settings(max_examples=10)
@given(scenarios())
def test_same_seed_same_report(sc: tuple[SimConfig, int, float, int]) -> None:
    cfg, n, rate, seed = sc
    trace = small_trace(n, rate, seed=seed)
    a = simulate(trace, cfg, seed)
    b = simulate(trace, cfg, seed)
    assert a.to_json() == b.to_json()


def test_fault_reroutes_running_and_queued_work() -> None:
    trace = small_trace(80, 40.0, seed=1)
    base = SimConfig(num_instances=3, kv_capacity_tokens=50_000)
    cfg = SimConfig(num_instances=3, kv_capacity_tokens=50_000, faults=(Fault(0.5, 1),))
    res = run_simulation(trace, cfg, 0)
    assert res.rerouted > 0
    assert not any(r.rejected for r in res.records)
    assert all(r.finish_s <= 0.5 for r in res.records if r.decode_instance == 1)
    assert any(r.prefill_instance == 1 for r in run_simulation(trace, base, 0).records)


def test_all_instances_dead_rejects_the_rest_explicitly() -> None:
    trace = small_trace(40, 20.0, seed=2)
    cfg = SimConfig(
        num_instances=2, kv_capacity_tokens=50_000, faults=(Fault(0.3, 0), Fault(0.6, 1))
    )
    res = run_simulation(trace, cfg, 0)
    assert res.rejections.get("no_instance", 0) > 0
    assert all(r.finish_s <= 0.6 for r in res.records if not r.rejected)
