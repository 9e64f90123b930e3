"""Decode instances keep the KV they receive, so per-request PD sees real multi-turn reuse."""

from __future__ import annotations

from _sched_fakes import LinearCost

from deepinfer_sched.policies import SchedulerConfig
from deepinfer_sched.report import SLO
from deepinfer_sched.sim import SimConfig, run_simulation
from deepinfer_sched.traces import Trace, TraceRequest

CM = LinearCost()  # prefill 1 ms/token, decode 10 ms + 1 us/ctx, transfer 0.1 ms/token
BS = 16


def multi_turn(convs: int = 12, turns: int = 5, gap_s: float = 3.0) -> Trace:
    """Each turn sends system prompt (20 blocks) + whole history + a 2-block message, and
    gets 32 tokens back; chained ids so turn k+1 extends turn k's prompt."""
    reqs = []
    next_id = 1_000_000
    for c in range(convs):
        ids = [c * 10_000 + k for k in range(20)]
        for t in range(turns):
            for _ in range(2 if t == 0 else 4):  # previous answer (2 blocks) + message
                ids.append(next_id)
                next_id += 1
            arrival = 0.37 * c + gap_s * t
            reqs.append(TraceRequest(0, arrival, len(ids) * BS, 32, tuple(ids), conversation_id=c))
    reqs.sort(key=lambda r: r.arrival_s)
    out = tuple(
        TraceRequest(
            i,
            r.arrival_s,
            r.input_len,
            r.output_len,
            r.block_hashes,
            conversation_id=r.conversation_id,
        )
        for i, r in enumerate(reqs)
    )
    return Trace(out, BS)


def _run(pd: str, trace: Trace, num_prefill: int = 1):  # type: ignore[no-untyped-def]
    cfg = SimConfig(
        SchedulerConfig(router="ttft_estimate", pd=pd, local_prefill_tokens=128),
        num_instances=4,
        num_prefill=num_prefill,
        kv_capacity_tokens=200_000,
        ttft_slo_s=0.2,
        tpot_slo_s=0.05,
    )
    return run_simulation(trace, cfg, 0, cost_model=CM)


def test_per_request_pd_prefills_follow_up_turns_on_their_decode_instance() -> None:
    # One prefill instance cannot keep up with every turn's prefill; per-request PD moves
    # the short follow-up prefills (4 uncached blocks = 64 tokens <= 128) to the decode
    # instance holding the history, so only first turns use the prefill pool.
    trace = multi_turn(convs=24, gap_s=2.0)
    dis = _run("disaggregated", trace)
    per = _run("per_request", trace)
    local = [r for r in per.records if r.prefill_instance == r.decode_instance]
    assert len(local) == 24 * 4
    assert all(r.prefill_instance >= 1 for r in local)
    assert all(r.prefill_instance == 0 for r in dis.records)
    assert [r.first_token_s for r in per.records] != [r.first_token_s for r in dis.records]
    slo = SLO(0.2, 0.05)
    rd, rp = dis.report(slo, 0.1, 1.0), per.report(slo, 0.1, 1.0)
    assert rp.ttft_s.mean < 0.5 * rd.ttft_s.mean
    assert rp.slo_attainment > rd.slo_attainment + 0.3
    assert rp.hit_rate > rd.hit_rate


def test_with_an_idle_prefill_pool_per_request_still_reuses_and_does_not_lose() -> None:
    trace = multi_turn(convs=12, gap_s=3.0)
    dis, per = _run("disaggregated", trace, 2), _run("per_request", trace, 2)
    slo = SLO(0.2, 0.05)
    rd, rp = dis.report(slo, 0.1, 1.0), per.report(slo, 0.1, 1.0)
    assert sum(r.prefill_instance == r.decode_instance for r in per.records) == 12 * 4
    assert rp.slo_attainment >= rd.slo_attainment
    assert rp.e2e_s.mean <= rd.e2e_s.mean


def test_received_kv_is_reusable_on_the_decode_instance() -> None:
    trace = multi_turn(convs=1, turns=2)
    per = _run("per_request", trace).records
    # Turn 2 reuses turn 1's whole prompt (24 blocks) from the decode instance's cache.
    assert per[1].decode_instance == per[0].decode_instance == per[1].prefill_instance
    assert per[1].cached_tokens == 22 * BS
