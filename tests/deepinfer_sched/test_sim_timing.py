"""Exact timings of tiny scenarios against hand-computed cost-model sums."""

from __future__ import annotations

import pytest
from _sched_fakes import LinearCost

from deepinfer_sched.policies import BatchConfig, SchedulerConfig
from deepinfer_sched.sim import SimConfig, run_simulation
from deepinfer_sched.traces import Trace, TraceRequest

CM = LinearCost()  # prefill 1 ms/token, decode 10 ms + 1 us/context token, transfer 0.1 ms/token


def _one(prompt: int, out: int, hashes: tuple[int, ...] = (), t: float = 0.0, rid: int = 0):  # type: ignore[no-untyped-def]
    return TraceRequest(rid, t, prompt, out, hashes)


@pytest.mark.parametrize("fast_forward", [True, False])
def test_chunked_prefill_then_decode(fast_forward: bool) -> None:
    trace = Trace((_one(1000, 5),), 16)
    cfg = SimConfig(
        SchedulerConfig(batch=BatchConfig(max_batched_tokens=256)),
        num_instances=1,
        kv_capacity_tokens=10_000,
        fast_forward=fast_forward,
    )
    rec = run_simulation(trace, cfg, 0, cost_model=CM).records[0]
    # Four chunks of 256, 256, 256, 232 tokens at 1 ms per token.
    assert rec.first_token_s == pytest.approx(1.0)
    # Four more tokens, contexts 1001..1004 (fast-forward uses the midpoint, int-rounded).
    decode = sum(0.01 + 1e-6 * c for c in range(1001, 1005))
    assert rec.finish_s - rec.first_token_s == pytest.approx(decode, abs=5e-6)


def test_decode_first_stretches_a_colocated_prefill() -> None:
    # Request 0 is decoding when request 1's prompt arrives: each of request 1's chunks
    # shares its iteration with request 0's decode step (budget 256 - 1 decode = 255).
    trace = Trace((_one(10, 200), _one(510, 2, t=0.05, rid=1)), 16)
    cfg = SimConfig(
        SchedulerConfig(batch=BatchConfig(max_batched_tokens=256)),
        num_instances=1,
        kv_capacity_tokens=10_000,
    )
    recs = run_simulation(trace, cfg, 0, cost_model=CM).records
    first0 = 0.010
    assert recs[0].first_token_s == pytest.approx(first0)
    # Request 1 waits for the decode step in flight at t=0.05, then runs 2 mixed iterations.
    step = 0.01 + 1e-6 * 11
    start = first0 + step * 4  # steps end at 0.0201, 0.0302, 0.0403, 0.0504 > 0.05
    assert recs[1].first_token_s == pytest.approx(start + 0.510 + 2 * 0.01, abs=1e-4)


def test_disaggregated_pays_the_kv_transfer() -> None:
    trace = Trace((_one(100, 3),), 16)
    cfg = SimConfig(
        SchedulerConfig(pd="disaggregated"),
        num_instances=2,
        num_prefill=1,
        kv_capacity_tokens=10_000,
    )
    rec = run_simulation(trace, cfg, 0, cost_model=CM).records[0]
    assert (rec.prefill_instance, rec.decode_instance) == (0, 1)
    assert rec.first_token_s == pytest.approx(0.1)
    transfer = 1e-4 * 101
    decode = (0.01 + 1e-6 * 101) + (0.01 + 1e-6 * 102)
    assert rec.finish_s == pytest.approx(0.1 + transfer + decode, abs=5e-6)


def test_prefix_hits_skip_prefill_and_ssd_hits_pay_the_fetch() -> None:
    hashes = tuple(range(6))  # 96 of 100 tokens in full blocks
    trace = Trace(
        (
            _one(100, 1, hashes),
            _one(100, 1, hashes, t=1.0, rid=1),
            _one(100, 1, hashes, t=2.0, rid=2),
        ),
        16,
    )
    sched = SchedulerConfig(router="round_robin")
    cfg = SimConfig(sched, num_instances=2, kv_capacity_tokens=10_000, ssd_capacity_blocks=100)
    recs = run_simulation(trace, cfg, 0, cost_model=CM).records
    assert recs[0].first_token_s == pytest.approx(0.100)
    # Request 1 lands on instance 1: 96 tokens come from the SSD tier, 4 are computed.
    assert recs[1].cached_tokens == 96
    assert recs[1].first_token_s - 1.0 == pytest.approx(2e-4 * 96 + 0.004)
    # Request 2 is back on instance 0, whose own cache holds the prefix: no fetch.
    assert recs[2].first_token_s - 2.0 == pytest.approx(0.004)
