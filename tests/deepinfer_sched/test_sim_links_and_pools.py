"""KV transfers and SSD reads share an instance's link; instances of a pool may differ."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pytest
from _sched_fakes import LinearCost

from deepinfer_sched.costmodel import FittedCostModel
from deepinfer_sched.policies import SchedulerConfig
from deepinfer_sched.sim import InstanceType, SimConfig, Simulator, run_simulation
from deepinfer_sched.traces import Trace, TraceRequest

CM = LinearCost()  # SSD 0.2 ms/token, transfer 0.1 ms/token


def _ssd_pair(contention: bool):  # type: ignore[no-untyped-def]
    prefix = tuple(range(6))  # 96 tokens
    reqs = (
        TraceRequest(0, 0.0, 100, 1, prefix),
        TraceRequest(1, 1.0, 49, 1, prefix[:3]),
        TraceRequest(2, 1.0, 49, 1, prefix[:3]),
    )
    cfg = SimConfig(
        num_instances=1,
        kv_capacity_tokens=10_000,
        prefix_cache_blocks=0,
        ssd_capacity_blocks=100,
        link_contention=contention,
    )
    return run_simulation(Trace(reqs, 16), cfg, 0, cost_model=CM).records


def test_ssd_reads_into_one_instance_queue_on_its_link() -> None:
    free = _ssd_pair(False)
    shared = _ssd_pair(True)
    fetch = 2e-4 * 48  # 3 cached blocks of 16 tokens from the SSD; 1 token prefilled
    # Without contention both fetches end together (then two 1 ms prefills); with it the
    # second fetch starts when the first ends.
    assert [r.first_token_s for r in free[1:]] == pytest.approx(
        [1.0 + fetch + 0.001, 1.0 + fetch + 0.002]
    )
    assert [r.first_token_s for r in shared[1:]] == pytest.approx(
        [1.0 + fetch + 0.001, 1.0 + 2 * fetch + 0.001]
    )


def test_kv_transfers_to_one_decode_instance_serialise() -> None:
    reqs = tuple(TraceRequest(i, 0.0, 500, 3, ()) for i in range(2))

    def run(contention: bool):  # type: ignore[no-untyped-def]
        cfg = SimConfig(
            SchedulerConfig(pd="disaggregated", router="round_robin"),
            num_instances=3,
            num_prefill=2,
            kv_capacity_tokens=10_000,
            link_contention=contention,
        )
        return run_simulation(Trace(reqs, 16), cfg, 0, cost_model=CM).records

    a, b = run(False), run(True)
    transfer = 1e-4 * 501
    assert [r.prefill_instance for r in b] == [0, 1]
    assert b[0].first_token_s == b[1].first_token_s == a[0].first_token_s
    # The second transfer starts when the first one ends.
    assert max(r.finish_s for r in b) - max(r.finish_s for r in a) == pytest.approx(
        transfer, rel=0.05
    )


def test_mixed_pool_of_rooflines_gives_each_instance_its_own_model() -> None:
    cfg = SimConfig(
        num_instances=3,
        instance_types=(InstanceType(1, "h800"), InstanceType(2, "h200", num_gpus=2)),
    )
    assert SimConfig.from_dict(cfg.to_dict()) == cfg
    sim = Simulator(Trace((TraceRequest(0, 0.0, 64, 2, ()),), 16), cfg, 0)
    caps = [x.kv_capacity_tokens for x in sim.instances]
    assert caps[0] < caps[1] == caps[2]
    assert sim.instances[0].cm is not sim.instances[1].cm
    assert sim.instances[1].cm is sim.instances[2].cm
    with pytest.raises(ValueError, match="add up to num_instances"):
        SimConfig(num_instances=4, instance_types=(InstanceType(1, "h800"),))


def test_ttft_estimate_prices_each_instance_with_its_own_model() -> None:
    fast = FittedCostModel((0.001, 1e-5, 0.0), (0.005, 1e-4, 1e-7), 1000, 100_000)
    slow = replace(fast, prefill_coef=(0.003, 3e-5, 0.0), decode_coef=(0.015, 3e-4, 3e-7))
    reqs = tuple(TraceRequest(i, 0.01 * i, 2000, 20, ()) for i in range(40))
    cfg = SimConfig(SchedulerConfig(router="ttft_estimate"), num_instances=2)
    recs = run_simulation(Trace(reqs, 16), cfg, 0, cost_model=[slow, fast]).records
    per = Counter(r.prefill_instance for r in recs)
    assert per[1] > 2 * per[0] > 0  # the 3x faster instance takes most, not all
    with pytest.raises(ValueError, match="2 models given for 3"):
        Simulator(Trace(reqs, 16), replace(cfg, num_instances=3), 0, [slow, fast])
