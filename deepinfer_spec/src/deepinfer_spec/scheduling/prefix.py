"""Hardware-aware prefix scheduler (DSpark Algorithm 1) with early stop."""

from __future__ import annotations

import torch
from torch import Tensor

from deepinfer_spec.scheduling.base import SchedulePlan, check_confidence_matrix, survival
from deepinfer_spec.scheduling.sps import SPSCurve

MIN_RELATIVE_GAIN = 1e-12
"""An admission must raise expected throughput by more than this fraction. Gains below it are
rounding: the vectorised sum ``R + (a_1 + a_2)`` and a running sum ``(R + a_1) + a_2`` differ in
the last bit, and without a margin a candidate of survival ~1e-16 is admitted by one and not
the other."""


class PrefixScheduler:
    """Admit draft positions greedily by survival while expected throughput rises.

    With survival ``a[r, j] = prod_{i <= j} c[r, i]``, all ``R * G`` candidates are sorted by
    ``a`` descending (ties by ``r`` ascending, then ``j``: a stable sort of the row-major
    flattening), and admitted one at a time. After
    ``m`` admissions ``B_m = R + m`` and ``tau_m = R + sum of the first m survivals``; the
    expected throughput is ``F_m = tau_m * SPS(B_m)``. The scheduler stops at the first ``m``
    with ``F_{m+1} <= F_m * (1 + MIN_RELATIVE_GAIN)`` (the early stop; the margin only absorbs
    float rounding) and verifies the first ``m`` candidates.

    Because ``a`` is non-increasing in ``j`` for each request and, within a request, ties keep
    the smaller ``j`` first,
    every admitted set is prefix-closed: position ``j`` is never verified without ``j - 1``.
    Vectorised: one sort, one cumulative sum, one curve evaluation over all ``R G + 1`` prefixes.

    Args:
        sps: the profiled steps-per-second curve of the target's verify forward.
        max_batch_size: optional cap on ``B`` (for example the largest captured CUDA graph).
    """

    def __init__(self, sps: SPSCurve, *, max_batch_size: int | None = None) -> None:
        if not isinstance(sps, SPSCurve):
            raise TypeError(f"sps must be an SPSCurve, got {type(sps).__name__}")
        if max_batch_size is not None and max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        self.sps = sps
        self.max_batch_size = max_batch_size

    def plan(self, confidence: Tensor) -> SchedulePlan:
        """Schedule ``confidence`` [R, G] and report expected tau, throughput and batch size."""
        check_confidence_matrix(confidence)
        r, g = confidence.shape
        device = confidence.device
        if r == 0:
            empty = torch.zeros(0, dtype=torch.int64, device=device)
            return SchedulePlan(empty, 0.0, 0.0, 0)
        a = survival(confidence).reshape(-1)
        # Stable descending sort over the row-major flattening: equal survivals keep (r, j)
        # order, so within a request position j precedes j + 1 (prefix closure under ties).
        order = torch.sort(a, descending=True, stable=True).indices
        gains = torch.cat([a.new_zeros(1), torch.cumsum(a[order], dim=0)])  # m = 0..RG
        batch = r + torch.arange(gains.numel(), device=device, dtype=torch.float64)
        throughput = (r + gains) * self.sps(batch)
        not_better = throughput[1:] <= throughput[:-1] * (1 + MIN_RELATIVE_GAIN)
        # First admission that does not raise throughput; all admissions if none.
        stop = torch.where(
            not_better.any(), torch.argmax(not_better.to(torch.int8)), not_better.numel()
        )
        if self.max_batch_size is not None:
            stop = stop.clamp(max=max(self.max_batch_size - r, 0))
        m = int(stop)
        rows = order[:m] // g
        counts = torch.bincount(rows, minlength=r).to(torch.int64)
        return SchedulePlan(counts, float(r + gains[m]), float(throughput[m]), r + m)

    def schedule(self, confidence: Tensor) -> Tensor:
        """``num_draft_tokens`` [R] int64 in ``[0, G]`` (see :meth:`plan`)."""
        return self.plan(confidence).num_draft_tokens

    def max_drafts(self, num_requests: int, gamma: int) -> int:
        """The most admissions :meth:`plan` can make for ``R`` requests, whatever the
        confidences: a bound on any one request's drafts.

        The ``j``-th admission (survival ``a <= 1``, after ``j - 1`` others of survival at least
        ``a``) raises throughput by a factor of at most ``(R + j) / (R + j - 1)`` (``a = 1``),
        so :meth:`plan` stops at the first ``j`` with ``(R + j) SPS(R + j) <= (R + j - 1)
        SPS(R + j - 1)`` at the latest. On a CPU, where verifying a few more tokens costs
        almost as much as a step, that is 1-3 drafts.
        """
        if num_requests < 1 or gamma < 1:
            return 0
        limit = num_requests * gamma
        if self.max_batch_size is not None:
            limit = min(limit, max(self.max_batch_size - num_requests, 0))
        batch = num_requests + torch.arange(limit + 1, dtype=torch.float64)
        tokens = batch * self.sps(batch)  # the throughput if every survival were 1
        # Margin above MIN_RELATIVE_GAIN: an upper bound may only err on the generous side.
        not_better = tokens[1:] <= tokens[:-1] * (1 - 1e-9)
        stop = int(torch.argmax(not_better.to(torch.int8))) if bool(not_better.any()) else limit
        return min(gamma, stop)
