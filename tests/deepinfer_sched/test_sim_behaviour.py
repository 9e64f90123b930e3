"""Simulator mechanisms, each checked against a configuration without it."""

from __future__ import annotations

import pytest
from _sim_traces import small_trace
from hypothesis import given
from hypothesis import strategies as st

from deepinfer_sched.policies import BatchConfig, SchedulerConfig
from deepinfer_sched.sim import (
    LRUBlockCache,
    SimConfig,
    SpecDecodeConfig,
    run_simulation,
    simulate,
)


def test_fast_forward_matches_step_by_step() -> None:
    trace = small_trace(150, 30.0, seed=4, max_output=200)
    sched = SchedulerConfig(router="round_robin")
    fast = run_simulation(trace, SimConfig(sched, num_instances=3, kv_capacity_tokens=50_000), 0)
    slow = run_simulation(
        trace, SimConfig(sched, num_instances=3, kv_capacity_tokens=50_000, fast_forward=False), 0
    )
    assert fast.events < slow.events / 3
    for a, b in zip(fast.records, slow.records, strict=True):
        assert a.first_token_s == pytest.approx(b.first_token_s, rel=1e-3, abs=1e-4)
        assert a.finish_s == pytest.approx(b.finish_s, rel=1e-3, abs=1e-4)


def test_speculative_decoding_cuts_tpot_and_verify_tokens_cost_time() -> None:
    trace = small_trace(60, 5.0, seed=5, max_output=200)
    base = SimConfig(num_instances=2, kv_capacity_tokens=50_000)
    plain = simulate(trace, base, 0).to_dict()["tpot_s"]["mean"]
    good = SimConfig(
        num_instances=2, kv_capacity_tokens=50_000, spec=SpecDecodeConfig(gamma=4, alpha=0.9)
    )
    bad = SimConfig(
        num_instances=2, kv_capacity_tokens=50_000, spec=SpecDecodeConfig(gamma=4, alpha=0.0)
    )
    assert simulate(trace, good, 0).to_dict()["tpot_s"]["mean"] < 0.6 * plain
    # Nothing accepted: one token per step, but each step verifies 5 tokens per sequence.
    assert simulate(trace, bad, 0).to_dict()["tpot_s"]["mean"] >= plain


def test_ssd_tier_raises_hit_rate() -> None:
    trace = small_trace(200, 10.0, seed=6)
    kw = dict(num_instances=4, kv_capacity_tokens=50_000, prefix_cache_blocks=4)
    no_ssd = simulate(trace, SimConfig(**kw), 0).hit_rate  # type: ignore[arg-type]
    ssd = simulate(trace, SimConfig(ssd_capacity_blocks=10_000, **kw), 0).hit_rate  # type: ignore[arg-type]
    assert ssd > no_ssd + 0.05


def test_small_kv_preempts_and_still_completes() -> None:
    trace = small_trace(60, 100.0, seed=7, max_output=150)
    res = run_simulation(trace, SimConfig(num_instances=1, kv_capacity_tokens=900), 0)
    assert res.preemptions > 0
    assert not any(r.rejected for r in res.records)


def test_disaggregated_roles() -> None:
    trace = small_trace(80, 20.0, seed=8)
    cfg = SimConfig(
        SchedulerConfig(pd="disaggregated"),
        num_instances=4,
        num_prefill=1,
        kv_capacity_tokens=50_000,
    )
    for r in run_simulation(trace, cfg, 0).records:
        assert r.prefill_instance == 0
        if r.output_len > 1:
            assert r.decode_instance >= 1
    # Per-request: short uncached prompts prefill on the decode instance itself.
    per = SimConfig(
        SchedulerConfig(pd="per_request", local_prefill_tokens=10**6),
        num_instances=4,
        num_prefill=1,
        kv_capacity_tokens=50_000,
    )
    assert all(r.prefill_instance >= 1 for r in run_simulation(trace, per, 0).records)


def test_ttft_admission_rejects_under_overload_and_lifts_attainment() -> None:
    trace = small_trace(300, 400.0, seed=9, max_prompt=2000)
    sched = SchedulerConfig(router="least_loaded", batch=BatchConfig(max_batched_tokens=512))
    adm = SchedulerConfig(
        router="least_loaded",
        batch=BatchConfig(max_batched_tokens=512),
        admission=("ttft",),
        ttft_slo_s=0.2,
    )
    kw = dict(num_instances=1, kv_capacity_tokens=50_000, ttft_slo_s=0.2, tpot_slo_s=0.2)
    open_ = simulate(trace, SimConfig(sched, **kw), 0)  # type: ignore[arg-type]
    gated = simulate(trace, SimConfig(adm, **kw), 0)  # type: ignore[arg-type]
    assert gated.num_rejected > 0 and open_.num_rejected == 0
    met_open = open_.num_met_slo / open_.num_completed
    met_gated = gated.num_met_slo / gated.num_completed
    assert met_gated > met_open


def test_rate_limit_rejects_only_the_limited_tenant() -> None:
    trace = small_trace(200, 50.0, seed=10, tenants=2)
    sched = SchedulerConfig(admission=("rate_limit",), rate_limits={"t0": (500.0, 1000.0)})
    res = run_simulation(trace, SimConfig(sched, num_instances=2, kv_capacity_tokens=50_000), 0)
    rejected = {r.tenant for r in res.records if r.rejected}
    assert rejected == {"t0"}
    assert res.rejections == {"rate_limited": sum(r.rejected for r in res.records)}


def test_migration_moves_sequences_off_hot_instances() -> None:
    trace = small_trace(120, 60.0, seed=11, max_output=300)
    sched = SchedulerConfig(
        router="round_robin",
        migration="threshold",
        migration_threshold=1.2,
        migration_interval_s=0.05,
    )
    res = run_simulation(trace, SimConfig(sched, num_instances=4, kv_capacity_tokens=50_000), 0)
    assert res.migrations > 0
    assert not any(r.rejected for r in res.records)


@given(
    prompts=st.lists(st.tuples(st.integers(0, 4), st.integers(0, 12)), min_size=1, max_size=40),
    capacity=st.integers(0, 30),
)
def test_lru_cache_stays_prefix_closed(prompts: list[tuple[int, int]], capacity: int) -> None:
    cache = LRUBlockCache(capacity)
    for root, length in prompts:
        hashes = tuple(root * 100 + k for k in range(length))
        cache.insert(hashes)
        assert len(cache) <= capacity
        for r in range(5):
            probe = tuple(r * 100 + k for k in range(12))
            linear = 0
            while linear < len(probe) and probe[linear] in cache:
                linear += 1
            assert cache.prefix_hits(probe) == linear
            # Prefix-closed: nothing cached beyond the first miss.
            assert not any(h in cache for h in probe[linear:])


def test_a_lone_sequence_is_not_bounced_between_instances() -> None:
    """Moving a sequence bigger than the planned amount would make the destination the hot
    instance; with fast-forwarded decode steps a lone sequence then bounced every interval and
    never finished (a hypothesis example hung the simulator)."""
    trace = small_trace(1, 10.0, seed=0, max_output=300)
    sched = SchedulerConfig(router="round_robin", migration="threshold", migration_interval_s=0.01)
    res = run_simulation(trace, SimConfig(sched, num_instances=2, kv_capacity_tokens=50_000), 0)
    assert res.migrations == 0
    assert not res.records[0].rejected
    assert res.events < 1000
