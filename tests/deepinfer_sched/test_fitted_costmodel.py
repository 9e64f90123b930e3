"""The cost model fitted to an engine's step profile, and ``deepinfer-sched calibrate``."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from deepinfer_sched.cli import main
from deepinfer_sched.costmodel import FittedCostModel, fit_profile, load_profile
from deepinfer_sched.policies import BatchConfig, SchedulerConfig
from deepinfer_sched.sim import SimConfig, run_simulation
from deepinfer_sched.traces import Trace, TraceRequest

P = (0.004, 2e-5, 3e-9)  # per step, per token, per (query, key) pair
D = (0.006, 4e-4, 2e-7)  # per step, per sequence, per context token


def _profile(noise: float = 0.0) -> dict[str, object]:
    pre, dec = [], []
    for i, n in enumerate((16, 64, 256, 512, 1024, 2048)):
        t = P[0] + P[1] * n + P[2] * n * (n + 1) / 2
        pre.append({"new_tokens": n, "cached_tokens": 0, "seconds": [t * (1 + noise * (-1) ** i)]})
    for b, ctx in ((1, 100), (1, 2000), (4, 400), (8, 8000), (16, 4000)):
        t = D[0] + D[1] * b + D[2] * ctx
        dec.append({"batch_size": b, "context_tokens": ctx, "seconds": [t, t * (1 + noise)]})
    return {
        "format": "deepinfer-step-profile",
        "version": 1,
        "engine": {"model": "tiny"},
        "kv_bytes_per_token": 46080,
        "kv_capacity_tokens": 32768,
        "prefill": pre,
        "decode": dec,
    }


def test_fit_recovers_known_coefficients() -> None:
    cm = fit_profile(_profile())
    assert cm.prefill_coef == pytest.approx(P, rel=1e-6)
    assert cm.decode_coef == pytest.approx(D, rel=1e-6)
    assert cm.fit_error["prefill_max_rel"] < 1e-9 and cm.fit_error["decode_max_rel"] < 1e-9
    assert cm.kv_capacity_tokens() == 32768
    assert cm.kv_transfer_time(1000) == pytest.approx(20e-6 + 1000 * 46080 / 25e9)
    assert FittedCostModel.from_json(cm.to_json()) == cm
    noisy = fit_profile(_profile(noise=0.05))
    assert 0.01 < noisy.fit_error["prefill_max_rel"] < 0.2
    assert all(v >= 0 for v in noisy.prefill_coef + noisy.decode_coef)


def test_simulating_with_a_fitted_model_uses_its_times() -> None:
    cm = fit_profile(_profile())
    trace = Trace((TraceRequest(0, 0.0, 512, 3, ()),), 16)
    cfg = SimConfig(SchedulerConfig(batch=BatchConfig(max_batched_tokens=2048)), num_instances=1)
    rec = run_simulation(trace, cfg, 0, cost_model=cm).records[0]
    assert rec.first_token_s == pytest.approx(cm.prefill_time(512, 0))
    steps = cm.decode_step_time(1, 513) + cm.decode_step_time(1, 514)
    assert rec.finish_s - rec.first_token_s == pytest.approx(steps)


@pytest.mark.parametrize(
    ("mutate", "match"),
    [
        (lambda p: p.update(format="x"), "not a step profile"),
        (lambda p: p.update(prefill=p["prefill"][:2]), "at least 3"),
        (lambda p: p["decode"][1].update(seconds=[]), r"decode\[1\]"),
        (lambda p: p["prefill"][0].update(new_tokens="16"), r"prefill\[0\]"),
        (lambda p: p.update(kv_bytes_per_token=0), "kv_bytes_per_token"),
    ],
)
def test_bad_profiles_name_the_entry(tmp_path: Path, mutate, match: str) -> None:  # type: ignore[no-untyped-def]
    prof = _profile()
    mutate(prof)
    path = tmp_path / "p.json"
    path.write_text(json.dumps(prof))
    with pytest.raises(ValueError, match=match):
        load_profile(path)


def test_calibrate_then_simulate_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "p.json").write_text(json.dumps(_profile()))
    out = tmp_path / "cm.json"
    assert main(["calibrate", "--profile", str(tmp_path / "p.json"), "--out", str(out)]) == 0
    assert "max rel err" in capsys.readouterr().out
    cm = FittedCostModel.from_json(out.read_text())
    assert cm.prefill_coef == pytest.approx(P, rel=1e-6)
    args = ["simulate", "--trace", "synthetic", "--requests", "20", "--rate", "0.5"]
    rc = main([*args, "--cost-model", str(out), "--out", str(tmp_path / "r"), "--no-plots"])
    assert rc == 0
    assert json.loads((tmp_path / "r" / "report.json").read_text())["report"]["num_requests"] == 20
    bad = ["calibrate", "--profile", str(out), "--out", str(tmp_path / "x.json")]
    assert main(bad) == 2
    assert "not a step profile" in capsys.readouterr().err


def test_scaled_multiplies_every_step_time_and_keeps_the_rest() -> None:
    cm = fit_profile(_profile())
    slow = cm.scaled(1.7)
    for n, c in ((16, 0), (512, 0), (300, 900)):
        assert slow.prefill_time(n, c) == pytest.approx(1.7 * cm.prefill_time(n, c), rel=1e-12)
    for b, t in ((1, 100), (8, 8000)):
        assert slow.decode_step_time(b, t) == pytest.approx(
            1.7 * cm.decode_step_time(b, t), rel=1e-12
        )
    assert slow.step_overhead_s == pytest.approx(1.7 * cm.step_overhead_s)
    hit = replace(cm, cached_coef=2e-6)
    assert hit.scaled(1.7).cached_coef == pytest.approx(1.7 * 2e-6)
    assert hit.scaled(1.7).prefill_time(300, 900) == pytest.approx(
        1.7 * hit.prefill_time(300, 900), rel=1e-12
    )
    assert slow.kv_transfer_time(1000) == cm.kv_transfer_time(1000)
    assert slow.kv_capacity_tokens() == cm.kv_capacity_tokens()
    assert slow.fit_error == cm.fit_error
    assert FittedCostModel.from_json(slow.to_json()) == slow
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="factor"):
            cm.scaled(bad)
    with pytest.raises(TypeError, match="factor"):
        cm.scaled(True)


def test_a_model_saved_before_cached_coef_loads_with_it_at_zero() -> None:
    doc = json.loads(fit_profile(_profile()).to_json())
    del doc["cached_coef"]
    old = FittedCostModel.from_json(json.dumps(doc))
    assert old.cached_coef == 0.0
    with pytest.raises(ValueError, match="cached_coef"):
        replace(old, cached_coef=-1e-6)
