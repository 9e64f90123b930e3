"""Calibration and ranking metrics: expected calibration error and rank-based AUC."""

from __future__ import annotations

import torch
from torch import Tensor


def _check_pair(probs: Tensor, labels: Tensor, what: str = "probs") -> tuple[Tensor, Tensor]:
    if not isinstance(probs, Tensor) or not isinstance(labels, Tensor):
        raise TypeError(f"{what} and labels must be torch tensors")
    if probs.shape != labels.shape:
        raise ValueError(
            f"{what} and labels must have the same shape, got {tuple(probs.shape)} "
            f"and {tuple(labels.shape)}"
        )
    p = probs.detach().reshape(-1).to(torch.float64)
    y = labels.detach().reshape(-1).to(torch.float64)
    if p.numel() == 0:
        raise ValueError(f"{what} must not be empty")
    if torch.isnan(p).any():
        raise ValueError(f"{what} must not contain NaN")
    if ((y != 0) & (y != 1)).any():
        raise ValueError("labels must be binary (bool or 0/1)")
    return p, y


def binned_ece(probs: Tensor, labels: Tensor, num_bins: int = 15) -> Tensor:
    """ECE of each row of ``probs`` [T, N] against ``labels`` [N], vectorised over rows.

    ``ECE = sum_b (n_b / N) * |mean_{i in b} p_i - mean_{i in b} y_i| = sum_b |sum p - sum y| / N``
    with ``num_bins`` equal-width bins on [0, 1] (``p = 1`` falls in the last bin). Inputs are
    assumed validated; returns float64 [T].
    """
    t, n = probs.shape
    idx = (probs * num_bins).floor().clamp_(0, num_bins - 1).long()
    idx = idx + torch.arange(t, device=probs.device).unsqueeze(1) * num_bins
    flat = idx.reshape(-1)
    sum_p = torch.bincount(flat, weights=probs.reshape(-1), minlength=t * num_bins)
    sum_y = torch.bincount(flat, weights=labels.expand(t, n).reshape(-1), minlength=t * num_bins)
    return (sum_p - sum_y).abs().reshape(t, num_bins).sum(dim=1) / n


def expected_calibration_error(probs: Tensor, labels: Tensor, num_bins: int = 15) -> float:
    """Expected calibration error with ``num_bins`` equal-width bins.

    ``ECE = sum_b (n_b / N) * |mean_{i in b} p_i - mean_{i in b} y_i|``; bin ``b`` holds
    ``b / num_bins <= p < (b + 1) / num_bins`` and the last bin also holds ``p = 1``.

    Args:
        probs: predicted probabilities in [0, 1], any shape.
        labels: binary outcomes (bool or 0/1) of the same shape.
        num_bins: number of bins, >= 1.
    """
    if not isinstance(num_bins, int) or num_bins < 1:
        raise ValueError(f"num_bins must be an int >= 1, got {num_bins!r}")
    p, y = _check_pair(probs, labels)
    if (p < 0).any() or (p > 1).any():
        raise ValueError("probs must lie in [0, 1]")
    return float(binned_ece(p.unsqueeze(0), y, num_bins)[0])


def auc(scores: Tensor, labels: Tensor) -> float:
    """Area under the ROC curve via the Mann-Whitney rank statistic, ties counted as one half.

    ``AUC = (sum of ranks of positives - P (P + 1) / 2) / (P * N)`` with average ranks for tied
    scores, which equals ``P(score_pos > score_neg) + 0.5 * P(score_pos == score_neg)``.
    Returns NaN when all labels are equal (AUC undefined).
    """
    s, y = _check_pair(scores, labels, "scores")
    n_pos = float(y.sum())
    n_neg = float(y.numel()) - n_pos
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    sorted_s, order = torch.sort(s)
    _, inverse, counts = torch.unique_consecutive(sorted_s, return_inverse=True, return_counts=True)
    ends = torch.cumsum(counts, 0).to(torch.float64)
    avg_rank = ends - (counts.to(torch.float64) - 1) / 2  # 1-based mean rank within a tie group
    ranks = torch.empty_like(s)
    ranks[order] = avg_rank[inverse]
    rank_sum = float((ranks * y).sum())
    return (rank_sum - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg)
