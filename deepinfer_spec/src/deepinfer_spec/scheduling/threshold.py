"""Baseline: verify each request's drafts while their survival stays above a fixed threshold."""

from __future__ import annotations

import math

from torch import Tensor

from deepinfer_spec.scheduling.base import check_confidence_matrix, survival


class ThresholdScheduler:
    """Verify drafts ``1..n_r`` with ``n_r = #{j : prod_{i <= j} c[r, i] >= threshold}``.

    Survival is non-increasing in ``j``, so the verified set is a prefix. The threshold ignores
    load: this is the static-confidence baseline that the prefix scheduler improves on.
    """

    def __init__(self, threshold: float) -> None:
        if not isinstance(threshold, (int, float)) or math.isnan(threshold):
            raise ValueError(f"threshold must be a number in [0, 1], got {threshold!r}")
        if not 0.0 <= threshold <= 1.0:
            raise ValueError(f"threshold must be in [0, 1], got {threshold}")
        self.threshold = float(threshold)

    def schedule(self, confidence: Tensor) -> Tensor:
        check_confidence_matrix(confidence)
        return (survival(confidence) >= self.threshold).sum(dim=1)
