"""Routers: each decision on small hand-built cluster states."""

from __future__ import annotations

import pytest
from _sched_fakes import FakeInstance, FakeRequest, LinearCost

from deepinfer_sched.policies import (
    CostRouter,
    InstanceView,
    LeastLoadedRouter,
    PowerOfTwoRouter,
    PrefixAffinityRouter,
    RequestView,
    RoundRobinRouter,
    TTFTEstimateRouter,
    estimate_ttft,
    routing_cost,
)


def test_fakes_satisfy_protocols() -> None:
    assert isinstance(FakeInstance(0), InstanceView)
    assert isinstance(FakeRequest(), RequestView)


def test_round_robin_cycles_and_survives_shrinking_pool() -> None:
    insts = [FakeInstance(i) for i in range(3)]
    r = RoundRobinRouter()
    picks = [r.route(FakeRequest(), insts).instance_id for _ in range(6)]
    assert picks == [0, 1, 2, 0, 1, 2]
    # One instance gone: the rotation continues over the survivors without restarting.
    assert [r.route(FakeRequest(), insts[:2]).instance_id for _ in range(2)] == [0, 1]


def test_least_loaded_counts_queued_plus_running_and_breaks_ties_low() -> None:
    insts = [
        FakeInstance(0, num_waiting=2, num_running=3),
        FakeInstance(1, num_waiting=0, num_running=4),
        FakeInstance(2, num_waiting=4, num_running=0),
    ]
    assert LeastLoadedRouter().route(FakeRequest(), insts).instance_id == 1
    insts[1].num_running = 5
    insts[2].num_running = 1
    assert LeastLoadedRouter().route(FakeRequest(), insts).instance_id == 0


def test_power_of_two_never_picks_the_worse_of_its_pair_and_is_seeded() -> None:
    insts = [FakeInstance(i, num_running=10 * i) for i in range(8)]
    a = [PowerOfTwoRouter(seed=3).route(FakeRequest(), insts).instance_id for _ in range(1)]
    r1, r2 = PowerOfTwoRouter(seed=3), PowerOfTwoRouter(seed=3)
    s1 = [r1.route(FakeRequest(), insts).instance_id for _ in range(50)]
    s2 = [r2.route(FakeRequest(), insts).instance_id for _ in range(50)]
    assert s1 == s2 and s1[0] == a[0]
    # The most loaded instance can never win a pair.
    assert 7 not in s1
    assert PowerOfTwoRouter().route(FakeRequest(), insts[:1]).instance_id == 0


def test_prefix_affinity_prefers_longest_prefix_within_load_cutoff() -> None:
    req = FakeRequest(block_hashes=(1, 2, 3, 4))
    insts = [
        FakeInstance(0, num_running=1, cached=(1,)),
        FakeInstance(1, num_running=2, cached=(1, 2, 3)),
        FakeInstance(2, num_running=1, cached=()),
    ]
    assert PrefixAffinityRouter(load_cutoff=2.0).route(req, insts).instance_id == 1
    # Overloaded beyond cutoff x (min + 1) = 4: affinity yields to the next-best prefix.
    insts[1].num_running = 9
    assert PrefixAffinityRouter(load_cutoff=2.0).route(req, insts).instance_id == 0
    with pytest.raises(ValueError, match="load_cutoff"):
        PrefixAffinityRouter(load_cutoff=0.5)


def test_cost_router_formula_and_choice() -> None:
    req = FakeRequest(input_len=64, block_hashes=(1, 2, 3, 4))
    a = FakeInstance(0, cached=(1, 2, 3, 4), kv_used_tokens=16 * 10)  # 0 uncached, 10 decode
    b = FakeInstance(1, cached=(), kv_used_tokens=0)  # 4 uncached, 0 decode
    assert routing_cost(req, a, 4.0) == 10.0
    assert routing_cost(req, b, 4.0) == 16.0
    assert CostRouter(4.0).route(req, [b, a]).instance_id == 0
    # With prefill weighted lightly, decode pressure dominates.
    assert CostRouter(1.0).route(req, [a, b]).instance_id == 1
    # SSD-reachable blocks count as cached; queued prefill counts against the instance.
    c = FakeInstance(2, ssd=(1, 2, 3, 4), waiting_tokens=32)
    assert routing_cost(req, c, 4.0) == 8.0


def test_ttft_estimate_components_and_choice() -> None:
    cm = LinearCost()
    req = FakeRequest(input_len=64, block_hashes=(1, 2, 3, 4))
    warm = FakeInstance(0, cached=(1, 2, 3), queue_s=0.05)
    cold = FakeInstance(1, queue_s=0.0)
    ssd = FakeInstance(2, ssd=(1, 2, 3, 4), queue_s=0.0)
    assert estimate_ttft(req, warm, cm) == pytest.approx(0.05 + 16e-3)
    assert estimate_ttft(req, cold, cm) == pytest.approx(64e-3)
    # 4 SSD blocks: fetch 64 tokens (12.8 ms), prefill 0 new tokens.
    assert estimate_ttft(req, ssd, cm) == pytest.approx(64 * 2e-4)
    assert estimate_ttft(req, cold, cm, transfer_to_decode=True) == pytest.approx(64e-3 + 6.4e-3)
    assert TTFTEstimateRouter(cm).route(req, [cold, warm, ssd]).instance_id == 2
    warm.queue_s = 0.0
    assert TTFTEstimateRouter(cm).route(req, [cold, warm, ssd]).instance_id == 2
    ssd.queue_s = 1.0
    assert TTFTEstimateRouter(cm).route(req, [cold, warm, ssd]).instance_id == 0
