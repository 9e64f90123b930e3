"""Fixed-gamma and threshold baselines, the SPS curve and its profiler."""

from __future__ import annotations

import json

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from deepinfer_spec.scheduling import (
    FixedGammaScheduler,
    SPSCurve,
    ThresholdScheduler,
    VerifyScheduler,
    profile_sps,
)


def test_fixed_gamma() -> None:
    conf = torch.rand(7, 5)
    assert FixedGammaScheduler(1).schedule(conf).tolist() == [1] * 7
    assert FixedGammaScheduler(9).schedule(conf).tolist() == [5] * 7
    assert FixedGammaScheduler(0).schedule(conf).dtype == torch.int64
    assert isinstance(FixedGammaScheduler(2), VerifyScheduler)
    with pytest.raises(ValueError, match="gamma"):
        FixedGammaScheduler(-1)


@given(st.floats(0.0, 1.0), st.integers(0, 2**31 - 1))
def test_threshold_is_the_survival_prefix(threshold: float, seed: int) -> None:
    conf = torch.rand(6, 5, generator=torch.Generator().manual_seed(seed))
    n = ThresholdScheduler(threshold).schedule(conf)
    a = torch.cumprod(conf.double(), dim=1)
    for i in range(6):
        k = int(n[i])
        assert (a[i, :k] >= threshold).all()
        assert k == 5 or a[i, k] < threshold


def test_threshold_errors() -> None:
    for bad in (-0.1, 1.5, float("nan")):
        with pytest.raises(ValueError, match="threshold"):
            ThresholdScheduler(bad)


def test_roofline_shape() -> None:
    add = SPSCurve.roofline(weight_read_s=4e-3, per_token_s=1e-4)
    assert add.at(1) == pytest.approx(1 / (4e-3 + 1e-4))
    assert add.at(100) == pytest.approx(1 / (4e-3 + 1e-2))
    ideal = SPSCurve.roofline(weight_read_s=4e-3, per_token_s=1e-4, overlap=1.0)
    assert ideal.at(1) == pytest.approx(ideal.at(40)) == pytest.approx(250.0)
    assert ideal.at(80) == pytest.approx(1 / 8e-3)
    b = torch.arange(1, 5000, dtype=torch.float64)
    assert (add(b)[1:] <= add(b)[:-1]).all()
    with pytest.raises(ValueError, match="overlap"):
        SPSCurve.roofline(1e-3, 1e-5, overlap=2.0)


def test_curve_is_monotone_despite_noise_and_extrapolates() -> None:
    curve = SPSCurve((1, 8, 16, 32), (100.0, 110.0, 80.0, 50.0))  # 8 looked faster than 1
    b = torch.arange(1, 80, dtype=torch.float64)
    sps = curve(b)
    assert (sps[1:] <= sps[:-1] + 1e-12).all()
    assert curve.at(16) == pytest.approx(80.0) and curve.at(32) == pytest.approx(50.0)
    # Beyond the last point the last segment's step-time slope continues.
    slope = (1 / 50 - 1 / 80) / 16
    assert curve.at(64) == pytest.approx(1 / (1 / 50 + 32 * slope))
    assert curve.at(0) == curve.at(1)
    assert SPSCurve((4,), (10.0,)).at(100) == pytest.approx(10.0)


def test_curve_json_round_trip_and_validation() -> None:
    curve = SPSCurve.roofline(3e-3, 5e-5, num_points=8)
    again = SPSCurve.from_dict(json.loads(json.dumps(curve.to_dict())))
    assert again == curve
    with pytest.raises(ValueError, match="increasing"):
        SPSCurve((2, 2), (1.0, 1.0))
    with pytest.raises(ValueError, match="> 0"):
        SPSCurve((1, 2), (1.0, 0.0))
    with pytest.raises(ValueError, match="equally long"):
        SPSCurve((1, 2), (1.0,))
    with pytest.raises(ValueError, match="dict"):
        SPSCurve.from_dict({"batch_sizes": [1]})


def test_profile_sps_with_a_fake_clock() -> None:
    clock = [0.0]
    calls: list[int] = []
    syncs = [0]

    def step(b: int) -> None:
        calls.append(b)
        clock[0] += 1e-3 + b * 1e-5

    def sync() -> None:
        syncs[0] += 1

    curve = profile_sps(
        step, [16, 1, 4], repeats=3, warmup=2, synchronize=sync, timer=lambda: clock[0]
    )
    assert curve.batch_sizes == (1, 4, 16)
    assert calls == [1] * 5 + [4] * 5 + [16] * 5
    assert syncs[0] == 3 * (1 + 3)
    for b in (1, 4, 16):
        assert curve.at(b) == pytest.approx(1 / (1e-3 + b * 1e-5))
    with pytest.raises(ValueError, match="batch_sizes"):
        profile_sps(step, [0, 2])
    with pytest.raises(ValueError, match="repeats"):
        profile_sps(step, [1], repeats=0)
