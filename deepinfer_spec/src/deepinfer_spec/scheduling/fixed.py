"""Baseline: verify the same number of drafts for every request."""

from __future__ import annotations

import torch
from torch import Tensor

from deepinfer_spec.scheduling.base import check_confidence_matrix


class FixedGammaScheduler:
    """Verify ``min(gamma, G)`` drafts of every request, whatever the confidence.

    ``gamma = G`` is plain speculative decoding; ``gamma = 1`` mimics a static one-token
    multi-token-prediction (MTP-1) setup; ``gamma = 0`` disables speculation.
    """

    def __init__(self, gamma: int) -> None:
        if not isinstance(gamma, int) or isinstance(gamma, bool) or gamma < 0:
            raise ValueError(f"gamma must be an int >= 0, got {gamma!r}")
        self.gamma = gamma

    def schedule(self, confidence: Tensor) -> Tensor:
        check_confidence_matrix(confidence)
        r, g = confidence.shape
        return torch.full((r,), min(self.gamma, g), dtype=torch.int64, device=confidence.device)

    def max_drafts(self, num_requests: int, gamma: int) -> int:
        """Never more than ``min(gamma, G)`` drafts per request."""
        return min(self.gamma, gamma)
