"""ECE and AUC against hand-computed values, and their input checks."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from deepinfer_spec.calibration import auc, expected_calibration_error


def test_ece_hand_computed() -> None:
    # 2 bins: [0, .5) holds 0.1, 0.3 (mean .2) with labels 0, 1 (mean .5): |.2 - .5| = .3
    # [.5, 1] holds 0.6, 0.9, 1.0 (mean 2.5/3) with labels 1, 1, 0 (mean 2/3): |.5/3| = 1/6
    probs = torch.tensor([0.1, 0.3, 0.6, 0.9, 1.0])
    labels = torch.tensor([0, 1, 1, 1, 0])
    expected = (2 / 5) * 0.3 + (3 / 5) * (0.5 / 3)
    assert expected_calibration_error(probs, labels, num_bins=2) == pytest.approx(expected)


def test_ece_zero_when_bins_match_frequencies() -> None:
    probs = torch.tensor([0.25] * 4 + [0.75] * 4)
    labels = torch.tensor([1, 0, 0, 0, 1, 1, 1, 0], dtype=torch.bool)
    assert expected_calibration_error(probs, labels, num_bins=10) == pytest.approx(0.0)


def test_ece_single_bin_is_mean_gap() -> None:
    probs = torch.tensor([0.2, 0.9, 0.4])
    labels = torch.tensor([1, 1, 0])
    assert expected_calibration_error(probs, labels, num_bins=1) == pytest.approx(abs(0.5 - 2 / 3))


def test_auc_hand_computed_with_ties() -> None:
    # Positives 0.8, 0.5; negatives 0.5, 0.2. Pairs: (0.8>0.5) 1, (0.8>0.2) 1,
    # (0.5=0.5) 0.5, (0.5>0.2) 1 -> 3.5 / 4.
    scores = torch.tensor([0.8, 0.5, 0.5, 0.2])
    labels = torch.tensor([1, 1, 0, 0])
    assert auc(scores, labels) == pytest.approx(3.5 / 4)


def test_auc_perfect_inverted_and_undefined() -> None:
    s = torch.tensor([0.1, 0.2, 0.3, 0.4])
    assert auc(s, torch.tensor([0, 0, 1, 1])) == pytest.approx(1.0)
    assert auc(s, torch.tensor([1, 1, 0, 0])) == pytest.approx(0.0)
    assert math.isnan(auc(s, torch.tensor([1, 1, 1, 1])))


@given(
    st.lists(
        st.tuples(st.sampled_from([0.1, 0.3, 0.5, 0.7]), st.booleans()), min_size=2, max_size=30
    )
)
def test_auc_matches_pairwise_definition(pairs: list[tuple[float, bool]]) -> None:
    scores = torch.tensor([p for p, _ in pairs], dtype=torch.float64)
    labels = torch.tensor([y for _, y in pairs])
    pos = [p for p, y in pairs if y]
    neg = [p for p, y in pairs if not y]
    got = auc(scores, labels)
    if not pos or not neg:
        assert math.isnan(got)
        return
    wins = sum((p > q) + 0.5 * (p == q) for p in pos for q in neg)
    assert got == pytest.approx(wins / (len(pos) * len(neg)))


def test_metric_input_errors() -> None:
    with pytest.raises(ValueError, match="same shape"):
        expected_calibration_error(torch.rand(3), torch.ones(4))
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        expected_calibration_error(torch.tensor([1.5]), torch.tensor([1]))
    with pytest.raises(ValueError, match="binary"):
        auc(torch.rand(2), torch.tensor([0, 2]))
    with pytest.raises(ValueError, match="num_bins"):
        expected_calibration_error(torch.rand(2), torch.tensor([0, 1]), num_bins=0)
    with pytest.raises(ValueError, match="empty"):
        auc(torch.zeros(0), torch.zeros(0))
