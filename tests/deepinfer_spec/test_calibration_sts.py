"""Sequential temperature scaling, the survival targets, the report and the diagram."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from deepinfer_spec.calibration import (
    apply_temperatures,
    calibrate_sts,
    calibration_report,
    expected_calibration_error,
    reliability_diagram,
    survival_targets,
)


def _overconfident(n: int = 3000, g: int = 5, scale: float = 2.0, seed: int = 0):
    """True conditional acceptance sigmoid(z); the head reports sigmoid(scale * z)."""
    gen = torch.Generator().manual_seed(seed)
    z = torch.randn(n, g, generator=gen) * 1.2 + 1.0
    accepted = torch.rand(n, g, generator=gen) < torch.sigmoid(z)
    return torch.sigmoid(scale * z), accepted


def _survival_ece(conf: torch.Tensor, accepted: torch.Tensor, k: int) -> float:
    surv, known, _ = survival_targets(accepted)
    pred = torch.cumprod(conf.double(), dim=1)
    return expected_calibration_error(pred[known[:, k], k], surv[known[:, k], k])


def test_sts_recovers_temperature_and_lowers_ece() -> None:
    conf, accepted = _overconfident(scale=2.0)
    temps = calibrate_sts(conf, accepted)
    assert temps.shape == (5,) and temps.dtype == torch.float32
    # Survival scaling fits the cumulative product, so later temperatures also absorb
    # sampling noise of earlier ones; the first must be close to the true 2.
    assert temps[0].item() == pytest.approx(2.0, rel=0.15)
    assert ((temps > 1.3) & (temps < 3.0)).all()
    scaled = apply_temperatures(conf, temps)
    for k in range(5):
        before, after = _survival_ece(conf, accepted, k), _survival_ece(scaled, accepted, k)
        assert after < 0.5 * before, (k, before, after)


def test_sts_leaves_calibrated_head_near_one() -> None:
    conf, accepted = _overconfident(scale=1.0, n=4000, seed=3)
    temps = calibrate_sts(conf, accepted)
    # Later positions see fewer surviving rows, so their fitted temperatures are noisier.
    assert ((temps[:3] > 0.8) & (temps[:3] < 1.25)).all(), temps
    assert ((temps > 0.6) & (temps < 1.6)).all(), temps


def test_sts_underconfident_gets_temperature_below_one() -> None:
    conf, accepted = _overconfident(scale=0.5, seed=1)
    assert calibrate_sts(conf, accepted)[0].item() == pytest.approx(0.5, rel=0.15)


def test_sts_grid_is_respected_and_empty_positions_default_to_one() -> None:
    conf, accepted = _overconfident(n=200, g=3)
    grid = torch.tensor([0.5, 1.0, 3.0])
    temps = calibrate_sts(conf, accepted, grid=grid)
    assert all(t in (0.5, 1.0, 3.0) for t in temps.tolist())
    valid = torch.zeros_like(accepted)
    valid[:, 0] = True  # only position 1 verified, and everything accepted there
    temps = calibrate_sts(conf, torch.ones_like(accepted), valid=valid, grid=grid)
    assert temps[1:].tolist() == [1.0, 1.0]


def test_survival_targets_masks() -> None:
    accepted = torch.tensor([[1, 0, 1], [1, 1, 1], [0, 1, 1]], dtype=torch.bool)
    valid = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 1, 1]], dtype=torch.bool)
    surv, known, cond = survival_targets(accepted, valid)
    assert surv.tolist() == [[1, 0, 0], [1, 1, 0], [0, 0, 0]]
    # Row 1 never verified position 3: its survival there is unknown.
    assert known.tolist() == [[True] * 3, [True, True, False], [True] * 3]
    assert cond.tolist() == [[True, True, False], [True, True, False], [True, False, False]]


def test_apply_temperatures_identity_and_errors() -> None:
    conf = torch.tensor([[0.2, 0.7], [0.5, 0.99]])
    torch.testing.assert_close(apply_temperatures(conf, torch.ones(2)), conf)
    sharper = apply_temperatures(conf, torch.tensor([0.5, 0.5]))
    assert sharper[0, 0] < 0.2 and sharper[0, 1] > 0.7 and sharper[1, 0] == pytest.approx(0.5)
    with pytest.raises(ValueError, match="temperatures"):
        apply_temperatures(conf, torch.ones(3))
    with pytest.raises(ValueError, match="> 0"):
        apply_temperatures(conf, torch.tensor([1.0, 0.0]))
    with pytest.raises(ValueError, match="probabilities"):
        calibrate_sts(conf * 2, torch.ones(2, 2, dtype=torch.bool))
    with pytest.raises(ValueError, match="same shape"):
        calibrate_sts(conf, torch.ones(2, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match="grid"):
        calibrate_sts(conf, torch.ones(2, 2, dtype=torch.bool), grid=torch.tensor([-1.0]))


def test_report_is_json_ready_and_shows_improvement() -> None:
    conf, accepted = _overconfident(n=2000)
    temps = calibrate_sts(conf, accepted)
    report = calibration_report(conf, accepted, temps)
    json.dumps(report)
    assert report["gamma"] == 5 and report["num_samples"] == 2000
    assert report["calibrated_mean_survival_ece"] < 0.5 * report["mean_survival_ece"]
    p1 = report["positions"][0]
    assert p1["n"] == 2000 and p1["ece"] == pytest.approx(p1["survival_ece"])
    # Monotone rescaling never changes the ranking, so AUC is unchanged.
    for p in report["positions"]:
        assert p["calibrated"]["auc"] == pytest.approx(p["auc"])
        assert 0.5 < p["auc"] < 1.0
    n = [p["n"] for p in report["positions"]]
    assert n == sorted(n, reverse=True)
    assert report["positions"][1]["n"] == int(accepted[:, 0].sum())


def test_report_without_data_at_a_position_is_nan() -> None:
    conf = torch.full((4, 2), 0.5)
    report = calibration_report(conf, torch.zeros(4, 2, dtype=torch.bool))
    assert report["positions"][1]["n"] == 0 and math.isnan(report["positions"][1]["ece"])
    assert math.isnan(report["positions"][0]["auc"])  # one class only


def test_reliability_diagram_writes_png(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    conf, accepted = _overconfident(n=500)
    temps = calibrate_sts(conf, accepted)
    out = reliability_diagram(conf, accepted, tmp_path / "rel.png", temps)
    data = Path(out).read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
