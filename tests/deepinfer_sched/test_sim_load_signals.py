"""Load signals count every accepted request, so routers spread load instead of herding."""

from __future__ import annotations

from collections import Counter

import pytest
from _sched_fakes import FakeInstance, FakeRequest, LinearCost

from deepinfer_sched.policies import SchedulerConfig, TTFTEstimateRouter
from deepinfer_sched.sim import SimConfig, Simulator, run_simulation
from deepinfer_sched.traces import Trace, TraceRequest

CM = LinearCost()  # prefill 1 ms/token, decode 10 ms + 1 us/ctx token, SSD 0.2 ms/token
SPREADING = ["least_loaded", "cost", "ttft_estimate", "prefix_affinity"]


def _unrelated(n: int, gap_s: float, prompt: int = 100, out: int = 500) -> Trace:
    reqs = tuple(
        TraceRequest(i, i * gap_s, prompt, out, tuple(range(i * 1000, i * 1000 + prompt // 16)))
        for i in range(n)
    )
    return Trace(reqs, 16)


@pytest.mark.parametrize("router", [*SPREADING, "round_robin"])
def test_spaced_unrelated_prompts_spread_over_instances_busy_only_decoding(router: str) -> None:
    # Each prompt's prefill (0.1 s) ends before the next arrives (0.2 s), so no queue is
    # ever non-empty at an arrival; only the running decode batch tells instances apart.
    trace = _unrelated(200, 0.2)
    cfg = SimConfig(SchedulerConfig(router=router), num_instances=4, kv_capacity_tokens=100_000)
    recs = run_simulation(trace, cfg, 0, cost_model=CM).records
    per = Counter(r.prefill_instance for r in recs)
    assert sorted(per) == [0, 1, 2, 3]
    assert max(per.values()) <= 60, per  # a fair share is 50


@pytest.mark.parametrize("router", [*SPREADING, "round_robin", "power_of_two"])
def test_no_instance_stays_idle_on_a_large_cluster(router: str) -> None:
    trace = _unrelated(400, 0.05, out=200)
    cfg = SimConfig(SchedulerConfig(router=router), num_instances=32, kv_capacity_tokens=100_000)
    res = run_simulation(trace, cfg, 0, cost_model=CM)
    used = {r.prefill_instance for r in res.records}
    assert len(used) == 32
    assert min(res.instance_busy_s.values()) > 0.0


@pytest.mark.parametrize("router", SPREADING)
def test_a_simultaneous_burst_lands_one_per_idle_instance(router: str) -> None:
    reqs = tuple(TraceRequest(i, 1.0, 64, 8, tuple(range(i * 100, i * 100 + 4))) for i in range(8))
    cfg = SimConfig(SchedulerConfig(router=router), num_instances=8, kv_capacity_tokens=10_000)
    recs = run_simulation(Trace(reqs, 16), cfg, 0, cost_model=CM).records
    assert sorted(r.prefill_instance for r in recs) == list(range(8))


@pytest.mark.parametrize("router", SPREADING)
def test_with_an_ssd_tier_no_instance_takes_more_than_its_share_within_a_fetch(
    router: str,
) -> None:
    # Request 0 puts a 64-block prefix on the SSD tier; no instance keeps it locally
    # (prefix_cache_blocks=0), so each later request fetches it (0.2 s). All 16 arrive within
    # 16 ms, far inside one fetch latency: a request still fetching must count as load.
    prefix = tuple(range(64))
    reqs = [TraceRequest(0, 0.0, 64 * 16, 1, prefix)]
    for i in range(1, 17):
        reqs.append(TraceRequest(i, 5.0 + i * 1e-3, 65 * 16, 20, (*prefix, 10_000 + i)))
    cfg = SimConfig(
        SchedulerConfig(router=router),
        num_instances=4,
        kv_capacity_tokens=100_000,
        prefix_cache_blocks=0,
        ssd_capacity_blocks=1000,
    )
    recs = run_simulation(Trace(tuple(reqs), 16), cfg, 0, cost_model=CM).records
    assert all(r.cached_tokens == 64 * 16 for r in recs[1:])
    per = Counter(r.prefill_instance for r in recs[1:])
    assert max(per.values()) <= 4, per


def test_fetching_requests_count_in_every_signal() -> None:
    prefix = tuple(range(64))
    trace = Trace(
        (TraceRequest(0, 0.0, 64 * 16, 1, prefix), TraceRequest(1, 5.0, 65 * 16, 4, prefix)),
        16,
    )
    cfg = SimConfig(
        num_instances=1, kv_capacity_tokens=100_000, prefix_cache_blocks=0, ssd_capacity_blocks=99
    )
    sim = Simulator(trace, cfg, 0, cost_model=CM)
    seen: list[tuple[int, int, int]] = []
    original = sim._enqueue

    def spy(inst, r, now, kick):  # type: ignore[no-untyped-def]
        original(inst, r, now, kick)
        if r.request_id == 1:
            seen.append((inst.num_waiting, inst.waiting_tokens, inst.kv_used_tokens))

    sim._enqueue = spy  # type: ignore[method-assign]
    sim.run()
    # Request 1 is fetching: one waiting request, 16 uncached tokens, its whole prompt's KV.
    assert seen == [(1, 16, 65 * 16)]


def test_ttft_estimate_prices_the_running_decode_batch() -> None:
    trace = _unrelated(1, 0.1, out=1000)
    cfg = SimConfig(num_instances=1, kv_capacity_tokens=100_000)
    sim = Simulator(trace, cfg, 0, cost_model=CM)
    # Advance the run until the request decodes, then look at the idle-queue instance.
    sim.trace = Trace((*trace.requests, TraceRequest(1, 1.0, 10, 1, ())), 16)
    probes: list[float] = []
    original = sim._dispatch

    def spy(r, now, admit):  # type: ignore[no-untyped-def]
        if r.request_id == 1:
            probes.append(sim.instances[0].estimated_queue_time_s())
        original(r, now, admit)

    sim._dispatch = spy  # type: ignore[method-assign]
    sim.run()
    assert probes and probes[0] == pytest.approx(0.01 + 1e-6 * (100 + 90), rel=0.05)


def test_ttft_estimate_ties_break_by_load_then_seeded_random() -> None:
    idle = [FakeInstance(i) for i in range(4)]
    loaded = FakeInstance(4, num_running=3)
    picks = {
        TTFTEstimateRouter(CM, seed=s).route(FakeRequest(), [*idle, loaded]).instance_id
        for s in range(20)
    }
    assert picks == {0, 1, 2, 3}  # never the loaded one, and not always the first
    a = [TTFTEstimateRouter(CM, seed=7).route(FakeRequest(), idle).instance_id for _ in range(3)]
    b = [TTFTEstimateRouter(CM, seed=7).route(FakeRequest(), idle).instance_id for _ in range(3)]
    assert a == b
    with pytest.raises(ValueError, match="rel_tol"):
        TTFTEstimateRouter(CM, rel_tol=-1.0)
