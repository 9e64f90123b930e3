"""Utilisation measures compute and bandwidth use, not just 'an iteration was in flight';
reports carry KV occupancy and queue depth over time."""

from __future__ import annotations

import json

import pytest

from deepinfer_sched.costmodel import RooflineCostModel, load_hardware, load_model
from deepinfer_sched.report import SLO
from deepinfer_sched.sim import SimConfig, run_simulation
from deepinfer_sched.traces import Trace, TraceRequest

CM = RooflineCostModel(load_hardware("h800"), load_model("dense-8b"))


def _batch(n: int, out: int = 400, prompt: int = 512) -> Trace:
    return Trace(tuple(TraceRequest(i, 0.0, prompt, out, ()) for i in range(n)), 16)


def _report(trace: Trace, **kw: object):  # type: ignore[no-untyped-def]
    cfg = SimConfig(num_instances=1, **kw)  # type: ignore[arg-type]
    res = run_simulation(trace, cfg, 0, cost_model=CM)
    return res, res.report(SLO(10.0, 1.0), 1.0, 2.0)


def test_a_lone_decode_is_busy_but_uses_little_compute() -> None:
    _, rep = _report(_batch(1))
    assert rep.busy_fraction[0] == pytest.approx(1.0, abs=0.02)
    assert rep.utilisation[0] < 0.02  # weights are read for one token per step
    assert 0.6 < rep.hbm_utilisation[0] < 1.0  # ... at the attainable HBM bandwidth


def test_utilisation_grows_with_the_batch_and_matches_the_work_done() -> None:
    _, lone = _report(_batch(1))
    _, full = _report(_batch(128))
    assert full.busy_fraction[0] == pytest.approx(1.0, abs=0.02)
    assert full.utilisation[0] > 20 * lone.utilisation[0]
    # Compute seconds are the FLOPs at the attainable rate: check one prefill by hand.
    res, rep = _report(Trace((TraceRequest(0, 0.0, 4096, 1, ()),), 16))
    compute, _ = CM.prefill_parts(4096, 0)
    assert rep.utilisation[0] * rep.duration_s == pytest.approx(compute, rel=1e-9)
    assert res.instance_busy_s[0] == pytest.approx(CM.prefill_time(4096, 0), rel=1e-9)


def test_fast_forward_and_step_by_step_agree_on_utilisation() -> None:
    trace = Trace(
        tuple(TraceRequest(i, 0.05 * i, 300 + 7 * i, 50 + 13 * i, ()) for i in range(40)), 16
    )
    _, a = _report(trace, fast_forward=True)
    _, b = _report(trace, fast_forward=False)
    assert a.utilisation[0] == pytest.approx(b.utilisation[0], rel=1e-6)
    assert a.hbm_utilisation[0] == pytest.approx(b.hbm_utilisation[0], rel=1e-6)


def test_timeline_tracks_kv_occupancy_and_queue_depth() -> None:
    # 64 prompts at once on a small KV: the queue drains while the KV fills, then empties.
    trace = _batch(64, out=200, prompt=2000)
    _, rep = _report(trace, kv_capacity_tokens=60_000, sample_interval_s=0.05)
    tl = rep.timeline
    assert tl is not None and len(tl.t_s) > 10
    assert all(b - a == pytest.approx(0.05) for a, b in zip(tl.t_s, tl.t_s[1:], strict=False))
    # The first sample is taken at the first arrival, before it is dispatched; then all 64
    # are accepted while at most ~30 fit the KV, so the rest wait.
    assert tl.queue_depth_total[0] == 0
    assert tl.queue_depth_total[1] >= 30 and tl.queue_depth_max[1] == tl.queue_depth_total[1]
    assert tl.queue_depth_total[-1] == 0
    assert 0.5 < tl.peak_kv_occupancy <= 1.0
    assert tl.kv_occupancy_max[-1] < tl.peak_kv_occupancy
    assert all(0.0 <= m <= x <= 1.0 for m, x in zip(tl.kv_occupancy_mean, tl.kv_occupancy_max))
    d = json.loads(rep.to_json())
    assert len(d["timeline"]["kv_occupancy_mean"]) == len(tl.t_s)
    assert set(d["busy_fraction"]) == set(d["utilisation"]) == set(d["hbm_utilisation"]) == {"0"}


def test_timeline_can_be_disabled() -> None:
    _, rep = _report(_batch(2), sample_interval_s=0.0)
    assert rep.timeline is not None and rep.timeline.t_s == ()
