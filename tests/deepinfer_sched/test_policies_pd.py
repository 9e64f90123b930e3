"""PD modes, decode pairing, the P:D planner, admission, migration and the config."""

from __future__ import annotations

import json

import pytest
from _sched_fakes import FakeInstance, FakeRequest, LinearCost

from deepinfer_sched.costmodel import RooflineCostModel, load_hardware, load_model
from deepinfer_sched.policies import (
    BatchConfig,
    ColocatedPD,
    CostRouter,
    DisaggregatedPD,
    LeastLoadedPairing,
    PerRequestPD,
    RateLimit,
    SchedulerConfig,
    TenantRateLimiter,
    ThresholdMigration,
    TTFTAdmission,
    TTFTEstimateRouter,
    WorkloadSummary,
    plan_pd_ratio,
)
from deepinfer_sched.traces import SyntheticTraceConfig, synthetic_trace


def test_pd_modes() -> None:
    assert not ColocatedPD().disaggregated
    assert DisaggregatedPD().disaggregated and not DisaggregatedPD().prefill_on_decode(0)
    pr = PerRequestPD(local_prefill_tokens=256)
    assert pr.disaggregated
    assert pr.prefill_on_decode(256) and not pr.prefill_on_decode(257)
    with pytest.raises(ValueError, match="local_prefill_tokens"):
        PerRequestPD(-1)


def test_pairing_least_loaded_with_room() -> None:
    insts = [
        FakeInstance(0, kv_used_tokens=500, kv_capacity_tokens=1000),
        FakeInstance(1, kv_used_tokens=900, kv_capacity_tokens=1000),
        FakeInstance(2, kv_used_tokens=200, kv_capacity_tokens=1000, num_running=3),
        FakeInstance(3, kv_used_tokens=200, kv_capacity_tokens=1000, num_running=1),
    ]
    p = LeastLoadedPairing()
    got = p.pick(FakeRequest(), insts, kv_tokens=300)
    assert got is not None and got.instance_id == 3
    got = p.pick(FakeRequest(), insts[:2], kv_tokens=300)
    assert got is not None and got.instance_id == 0
    assert p.pick(FakeRequest(), insts, kv_tokens=900) is None
    # Headroom keeps a share of capacity free for running sequences to grow into.
    assert LeastLoadedPairing(headroom=0.5).pick(FakeRequest(), insts, kv_tokens=400) is None


def test_pd_planner_balances_pools() -> None:
    cm = RooflineCostModel(load_hardware("h800"), load_model("dense-8b"))
    w = WorkloadSummary(
        request_rate=10.0, mean_uncached_tokens=4000, mean_cached_tokens=0, mean_output_len=300
    )
    plan = plan_pd_ratio(w, cm, 8, ttft_slo_s=2.0, tpot_slo_s=0.05, kv_capacity_tokens=400_000)
    assert plan.num_prefill + plan.num_decode == 8
    assert plan.num_prefill >= 1 and plan.num_decode >= 1
    # No other split sustains a higher SLO-meeting rate.
    p_rate = plan.prefill_capacity_rps / plan.num_prefill
    d_rate = plan.decode_capacity_rps / plan.num_decode
    best = max(min(p * p_rate, (8 - p) * d_rate) for p in range(1, 8))
    assert plan.capacity_rps == pytest.approx(best)
    # Longer outputs shift instances towards decode.
    w_long = WorkloadSummary(10.0, 4000, 0, 3000)
    plan_long = plan_pd_ratio(w_long, cm, 8, 2.0, 0.05, 400_000)
    assert plan_long.num_decode >= plan.num_decode
    with pytest.raises(ValueError, match="total_instances"):
        plan_pd_ratio(w, cm, 1, 2.0, 0.05, 400_000)


def test_workload_summary_from_trace() -> None:
    tr = synthetic_trace(SyntheticTraceConfig(num_requests=200, seed=1))
    w = WorkloadSummary.from_trace(tr)
    st = tr.stats()
    assert w.mean_cached_tokens + w.mean_uncached_tokens == pytest.approx(st.mean_input_len)
    assert w.request_rate == pytest.approx(st.request_rate)
    cold = WorkloadSummary.from_trace(tr, hit_rate=0.0)
    assert cold.mean_cached_tokens == 0.0
    assert cold.mean_uncached_tokens == pytest.approx(st.mean_input_len)
    with pytest.raises(ValueError, match="hit_rate"):
        WorkloadSummary.from_trace(tr, hit_rate=1.5)


def test_ttft_admission_uses_prediction_lazily() -> None:
    adm = TTFTAdmission(ttft_slo_s=1.0, slack=1.5)
    calls: list[int] = []

    def pred(v: float):  # type: ignore[no-untyped-def]
        def f() -> float:
            calls.append(1)
            return v

        return f

    assert adm.check(FakeRequest(), 0.0, pred(1.4)) is None
    assert adm.check(FakeRequest(), 0.0, pred(1.6)) == "predicted_ttft"
    assert len(calls) == 2
    with pytest.raises(ValueError, match="ttft_slo_s"):
        TTFTAdmission(0.0)


def test_rate_limiter_token_bucket_per_tenant() -> None:
    lim = TenantRateLimiter({"a": RateLimit(tokens_per_s=100.0, burst_tokens=200.0)})
    never = lambda: 0.0  # noqa: E731
    r = FakeRequest(tenant="a", input_len=90, output_len=10)  # costs 100
    assert lim.check(r, 0.0, never) is None
    assert lim.check(r, 0.0, never) is None
    assert lim.check(r, 0.0, never) == "rate_limited"
    assert lim.check(r, 0.5, never) == "rate_limited"  # 50 tokens refilled
    assert lim.check(r, 1.0, never) is None  # 100 refilled
    # Other tenants are unlimited without a default.
    assert lim.check(FakeRequest(tenant="b", input_len=10**9), 1.0, never) is None
    with pytest.raises(ValueError, match="now_s"):
        lim.check(r, 0.5, never)
    with pytest.raises(ValueError, match="tokens_per_s"):
        RateLimit(0.0, 1.0)


def test_threshold_migration_moves_excess_to_coolest() -> None:
    insts = [
        FakeInstance(0, kv_used_tokens=1000),
        FakeInstance(1, kv_used_tokens=100),
        FakeInstance(2, kv_used_tokens=100),
    ]
    moves = ThresholdMigration(threshold=1.5).plan(insts)
    # mean 400; instance 0 is 2.5x the mean, sends excess 600 capped by dst room 300.
    assert len(moves) == 1
    assert (moves[0].src, moves[0].dst, moves[0].kv_tokens) == (0, 1, 300)
    assert ThresholdMigration(threshold=3.0).plan(insts) == []
    assert ThresholdMigration().plan(insts[:1]) == []
    with pytest.raises(ValueError, match="threshold"):
        ThresholdMigration(threshold=1.0)


def test_scheduler_config_builds_and_round_trips() -> None:
    cfg = SchedulerConfig(
        router="ttft_estimate",
        pd="per_request",
        batch=BatchConfig(max_num_seqs=32),
        admission=("ttft", "rate_limit"),
        ttft_slo_s=2.0,
        rate_limits={"t": (1000.0, 5000.0)},
        migration="threshold",
    )
    pol = cfg.build(LinearCost())
    assert isinstance(pol.router, TTFTEstimateRouter) and pol.router.transfer_to_decode
    assert isinstance(pol.pd, PerRequestPD)
    assert len(pol.admission) == 2 and pol.migration is not None
    again = SchedulerConfig.from_dict(json.loads(json.dumps(cfg.to_dict())))
    assert again == cfg
    assert isinstance(SchedulerConfig(router="cost").build(LinearCost()).router, CostRouter)


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"router": "random"}, "router"),
        ({"pd": "split"}, "pd"),
        ({"migration": "always"}, "migration"),
        ({"admission": ("ttft",)}, "ttft_slo_s"),
        ({"admission": ("magic",)}, "admission"),
        ({"prefill_weight": -1.0}, "prefill_weight"),
        ({"load_cutoff": 0.0}, "load_cutoff"),
        ({"migration": "threshold", "migration_threshold": 0.5}, "threshold"),
    ],
)
def test_scheduler_config_rejects_bad_values(kw: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        SchedulerConfig(**kw)  # type: ignore[arg-type]


def test_scheduler_config_from_dict_rejects_unknown_keys() -> None:
    with pytest.raises(ValueError, match="unknown SchedulerConfig keys"):
        SchedulerConfig.from_dict({"routr": "cost"})
