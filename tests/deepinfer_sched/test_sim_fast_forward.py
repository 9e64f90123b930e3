"""fast_forward=True (pure-decode stretches as one event) against step-by-step simulation,
for every router and PD mode: the documented tolerance is 1e-6 relative per request."""

from __future__ import annotations

import pytest

from deepinfer_sched.policies import ROUTERS, SchedulerConfig
from deepinfer_sched.report import SLO
from deepinfer_sched.sim import SimConfig, SpecDecodeConfig, run_simulation
from deepinfer_sched.traces import SyntheticTraceConfig, synthetic_trace

TRACE = synthetic_trace(SyntheticTraceConfig(num_requests=120, request_rate=1.5, seed=1))


@pytest.mark.parametrize("pd", ["colocated", "per_request"])
@pytest.mark.parametrize("router", ROUTERS)
def test_fast_forward_agrees_with_step_by_step(router: str, pd: str) -> None:
    def run(ff: bool):  # type: ignore[no-untyped-def]
        cfg = SimConfig(
            SchedulerConfig(router=router, pd=pd),
            num_instances=4,
            num_prefill=2 if pd != "colocated" else 0,
            ssd_capacity_blocks=1_000_000,
            fast_forward=ff,
        )
        return run_simulation(TRACE, cfg, 0)

    a, b = run(True), run(False)
    assert a.events < b.events / 3  # the fast path really skips steps
    for x, y in zip(a.records, b.records, strict=True):
        assert (x.prefill_instance, x.decode_instance) == (y.prefill_instance, y.decode_instance)
        assert x.cached_tokens == y.cached_tokens
        assert x.first_token_s == pytest.approx(y.first_token_s, rel=1e-6, abs=1e-9)
        assert x.finish_s == pytest.approx(y.finish_s, rel=1e-6, abs=1e-9)
    slo = SLO(2.0, 0.1)
    ra, rb = a.report(slo, 1.0, 2.0), b.report(slo, 1.0, 2.0)
    assert ra.tpot_s.p50 == pytest.approx(rb.tpot_s.p50, rel=1e-6)
    assert ra.hit_rate == rb.hit_rate
    assert ra.slo_attainment == rb.slo_attainment


def test_fast_forward_with_speculative_decoding_stays_close() -> None:
    # Fractional tokens per step (accepted drafts) make the context non-integral, so the
    # trapezoid's whole-token ends round differently from per-step reads: aggregate
    # agreement only, to 1e-3.
    def run(ff: bool):  # type: ignore[no-untyped-def]
        cfg = SimConfig(
            SchedulerConfig(router="cost"),
            num_instances=4,
            spec=SpecDecodeConfig(gamma=4, alpha=0.6, acceptance="fixed"),
            fast_forward=ff,
        )
        return run_simulation(TRACE, cfg, 0).report(SLO(2.0, 0.1), 1.0, 2.0)

    a, b = run(True), run(False)
    assert a.tpot_s.mean == pytest.approx(b.tpot_s.mean, rel=1e-3)
    assert a.ttft_s.mean == pytest.approx(b.ttft_s.mean, rel=1e-3)
