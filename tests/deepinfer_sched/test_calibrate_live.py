"""Calibrating the cost model from a live profile (``steps`` recorded by serving replicas)."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from deepinfer_sched.cli import main
from deepinfer_sched.costmodel import (
    PROFILE_FORMAT,
    FittedCostModel,
    fit_profile,
    load_profile,
    merge_profiles,
)

# o: per step; e: per prefill chunk; k: per token already cached when a chunk runs.
TRUE = {"o": 0.012, "p1": 40e-6, "p2": 2e-9, "d1": 300e-6, "d2": 1e-6, "e": 0.02, "k": 5e-6}


def _step_time(
    prefill: list[list[int]], b: int, t: int, true: dict[str, float] | None = None
) -> float:
    v = TRUE if true is None else true
    pre = sum(
        v["e"] + v["p1"] * n + v["p2"] * n * (c + (n + 1) / 2) + v["k"] * c for n, c in prefill
    )
    return v["o"] + pre + v["d1"] * b + v["d2"] * t


def _live(
    num: int = 400, noise: float = 0.0, seed: int = 0, true: dict[str, float] | None = None
) -> dict[str, Any]:
    rng = random.Random(seed)
    steps = []
    for _ in range(num):
        prefill = [
            [rng.randint(1, 512), rng.choice([0, 0, 64, 256, 900])]
            for _ in range(rng.randint(0, 2))
        ]
        b = rng.randint(0 if prefill else 1, 12)
        t = b * rng.randint(30, 1500)
        secs = _step_time(prefill, b, t, true) * (1.0 + rng.uniform(-noise, noise))
        steps.append({"prefill": prefill, "batch_size": b, "context_tokens": t, "seconds": secs})
    return {
        "format": PROFILE_FORMAT,
        "version": 1,
        "engine": {"model": "m"},
        "kv_bytes_per_token": 1024,
        "kv_capacity_tokens": 16384,
        "steps": steps,
    }


def test_joint_fit_recovers_the_step_model_exactly_and_under_noise() -> None:
    cm = fit_profile(_live())
    prefill = (TRUE["o"] + TRUE["e"], TRUE["p1"], TRUE["p2"])
    assert cm.prefill_coef == pytest.approx(prefill, rel=1e-6)
    assert cm.decode_coef == pytest.approx((TRUE["o"], TRUE["d1"], TRUE["d2"]), rel=1e-6)
    assert cm.cached_coef == pytest.approx(TRUE["k"], rel=1e-6)
    assert cm.step_overhead_s == pytest.approx(TRUE["o"], rel=1e-6)
    assert cm.fit_error["steps_rel_rms"] < 1e-9
    noisy = fit_profile(_live(2000, noise=0.3, seed=1))
    assert noisy.prefill_coef[1] == pytest.approx(TRUE["p1"], rel=0.1)
    assert noisy.decode_coef[1] == pytest.approx(TRUE["d1"], rel=0.15)
    assert noisy.step_overhead_s == pytest.approx(TRUE["o"], rel=0.15)
    assert noisy.prefill_coef[0] - noisy.step_overhead_s == pytest.approx(TRUE["e"], rel=0.15)
    assert noisy.cached_coef == pytest.approx(TRUE["k"], rel=0.15)
    assert 0.05 < noisy.fit_error["steps_rel_rms"] < 0.3
    assert noisy.fit_error["steps_total_rel"] < 0.01


def test_an_engine_without_chunk_or_cache_costs_fits_them_as_zero() -> None:
    """The two extra terms stay at zero when the steps do not need them (the plain model is
    recovered, not bent to use the new columns)."""
    plain = {**TRUE, "e": 0.0, "k": 0.0}
    cm = fit_profile(_live(true=plain))
    assert cm.prefill_coef == pytest.approx((TRUE["o"], TRUE["p1"], TRUE["p2"]), rel=1e-6)
    assert cm.cached_coef == pytest.approx(0.0, abs=1e-12)


def test_a_lone_decode_step_and_a_prefill_after_a_hit_cost_what_they_measured() -> None:
    """Session 12's live fit (one shared per-step term, no cached-token term) charged a lone
    decode step ~1.5x and a prefill after a prefix hit ~0.8x their measured times. With the
    per-chunk and per-cached-token terms the simulator charges both as measured."""
    cm = fit_profile(_live())
    assert cm.decode_step_time(1, 130) == pytest.approx(_step_time([], 1, 130), rel=1e-6)
    assert cm.prefill_time(53, 400) == pytest.approx(_step_time([[53, 400]], 0, 0), rel=1e-6)


def test_a_mixed_iteration_costs_what_the_fit_says() -> None:
    """The simulator charges a mixed iteration as every part's time with the per-step term
    once (`Instance.plan_iteration`); for a live fit that is exactly the fitted step."""
    cm = fit_profile(_live())
    chunks, b, t = [[100, 0], [37, 512]], 5, 4000
    sim = (
        sum(cm.prefill_time(n, c) for n, c in chunks)
        + cm.decode_step_time(b, t)
        - (len(chunks)) * cm.step_overhead_s
    )
    assert sim == pytest.approx(_step_time(chunks, b, t), rel=1e-6)


def test_bad_live_rows_are_refused_naming_the_row(tmp_path: Path) -> None:
    for bad, what in (
        (
            {"prefill": [[0, 3]], "batch_size": 0, "context_tokens": 0, "seconds": 0.1},
            "steps\\[1\\]",
        ),
        ({"prefill": [], "batch_size": 0, "context_tokens": 0, "seconds": 0.1}, "steps\\[1\\]"),
        ({"prefill": [], "batch_size": 2, "context_tokens": 9, "seconds": -1.0}, "steps\\[1\\]"),
        ({"prefill": [[4]], "batch_size": 1, "context_tokens": 9, "seconds": 0.1}, "steps\\[1\\]"),
        ({"prefill": [], "batch_size": True, "context_tokens": 9, "seconds": 0.1}, "steps\\[1\\]"),
    ):
        prof = _live(3)
        prof["steps"][1] = bad
        path = tmp_path / "bad.json"
        path.write_text(json.dumps(prof))
        with pytest.raises(ValueError, match=what):
            load_profile(path)
    prof = _live(2)
    path.write_text(json.dumps(prof))
    with pytest.raises(ValueError, match="at least 3"):
        load_profile(path)


def test_merge_joins_replicas_of_one_engine_only() -> None:
    a, b = _live(10, seed=1), _live(7, seed=2)
    merged = merge_profiles([a, b])
    assert merged["steps"] == a["steps"] + b["steps"]
    with pytest.raises(ValueError, match="kv_capacity_tokens"):
        merge_profiles([a, {**b, "kv_capacity_tokens": 1}])
    offline = {k: v for k, v in a.items() if k != "steps"}
    with pytest.raises(ValueError, match="no 'steps'"):
        merge_profiles([a, offline])
    with pytest.raises(ValueError, match="no profiles"):
        merge_profiles([])


def test_cli_calibrates_from_several_live_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    files = []
    for i in range(2):
        path = tmp_path / f"live-replica-{i}.json"
        path.write_text(json.dumps(_live(200, seed=i)))
        files.append(str(path))
    out = tmp_path / "cm.json"
    assert main(["calibrate", "--profile", *files, "--out", str(out)]) == 0
    assert "400 live steps" in capsys.readouterr().out
    cm = FittedCostModel.from_json(out.read_text())
    assert cm.decode_coef == pytest.approx((TRUE["o"], TRUE["d1"], TRUE["d2"]), rel=1e-6)
    offline = tmp_path / "offline.json"
    doc = _live(3)
    del doc["steps"]
    doc["prefill"] = [
        {"new_tokens": n, "cached_tokens": 0, "seconds": [0.01 * n]} for n in (1, 2, 4)
    ]
    doc["decode"] = [{"batch_size": b, "context_tokens": 9, "seconds": [0.01]} for b in (1, 2, 3)]
    offline.write_text(json.dumps(doc))
    assert main(["calibrate", "--profile", files[0], str(offline), "--out", str(out)]) == 2
    assert "live profiles" in capsys.readouterr().err
