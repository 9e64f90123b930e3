"""The verification-scheduler seam: confidences in, per-request number of drafts to verify out."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import torch
from torch import Tensor

if TYPE_CHECKING:
    from deepinfer_spec.scheduling.sps import SPSCurve


@runtime_checkable
class VerifyScheduler(Protocol):
    """Chooses how many draft tokens of each request the target verifies this step.

    ``schedule(confidence [R, G]) -> num_draft_tokens [R]`` (int64, on ``confidence``'s device,
    each in ``[0, G]``); request ``r`` verifies its drafts ``1..num_draft_tokens[r]``. The anchor
    token of every request is always verified on top of these.
    """

    def schedule(self, confidence: Tensor) -> Tensor: ...


@runtime_checkable
class BoundedScheduler(Protocol):
    """A :class:`VerifyScheduler` that knows, before any confidence exists, the most drafts it
    can verify for one request of an ``R``-request step. A drafter then draws only that many
    tokens (the head, the sequential step and the confidence of the others would be wasted:
    on a CPU the head over the draft vocabulary is a large part of a proposal)."""

    def max_drafts(self, num_requests: int, gamma: int) -> int: ...


def draft_bound(scheduler: VerifyScheduler, num_requests: int, gamma: int) -> int:
    """``scheduler.max_drafts(R, G)`` clamped to ``[0, G]``, or ``G`` when it gives no bound."""
    # What isinstance(scheduler, BoundedScheduler) decides (a member that is present and not
    # None), without the runtime Protocol check: 20-30 us in a drafting step.
    max_drafts = getattr(scheduler, "max_drafts", None)
    if max_drafts is None:
        return gamma
    return max(0, min(gamma, int(max_drafts(num_requests, gamma))))


@dataclass(frozen=True)
class SchedulePlan:
    """A schedule and its expected value under the model ``throughput = tau * SPS(B)``.

    Attributes:
        num_draft_tokens: [R] int64, drafts verified per request.
        expected_tau: ``R + sum_r sum_{j <= n_r} prod_{i <= j} c_{r,i}``, the expected number of
            tokens emitted this step (each request emits at least its correction/bonus token).
        expected_throughput: ``expected_tau * SPS(batch_size)`` in tokens per second.
        batch_size: ``B = R + sum_r n_r``, tokens in the verify forward (anchors included).
    """

    num_draft_tokens: Tensor
    expected_tau: float
    expected_throughput: float
    batch_size: int


# Matrices up to this many entries are range-checked as Python floats (one tolist).
_SMALL = 256


def check_confidence_matrix(confidence: Tensor) -> None:
    """Raise unless ``confidence`` is a floating [R, G] tensor of probabilities in [0, 1]."""
    if not isinstance(confidence, Tensor):
        raise TypeError(f"confidence must be a torch.Tensor, got {type(confidence).__name__}")
    if not confidence.is_floating_point():
        raise TypeError(f"confidence must be a floating tensor, got {confidence.dtype}")
    if confidence.dim() != 2:
        raise ValueError(f"confidence must be [R, G], got shape {tuple(confidence.shape)}")
    # One torch call, not six: a drafting step schedules a few confidences every step. A
    # chained comparison is False for NaN, as is aminmax's NaN bound.
    if confidence.numel() <= _SMALL:
        ok = all(0.0 <= c <= 1.0 for row in confidence.tolist() for c in row)
    else:
        lo, hi = torch.aminmax(confidence)
        ok = float(lo) >= 0.0 and float(hi) <= 1.0
    if not ok:
        raise ValueError("confidence must hold probabilities in [0, 1] (no NaN)")


def survival(confidence: Tensor) -> Tensor:
    """``a[r, j] = prod_{i <= j} c[r, i]`` in float64 (non-increasing in ``j``)."""
    return torch.cumprod(confidence.to(torch.float64), dim=1)


def evaluate_schedule(confidence: Tensor, num_draft_tokens: Tensor, sps: SPSCurve) -> SchedulePlan:
    """Expected tau, batch size and throughput of any schedule (used to compare schedulers)."""
    check_confidence_matrix(confidence)
    r, g = confidence.shape
    n = num_draft_tokens.to(device=confidence.device, dtype=torch.int64)
    if n.shape != (r,) or (n < 0).any() or (n > g).any():
        raise ValueError(f"num_draft_tokens must be [{r}] with values in [0, {g}]")
    a = survival(confidence)
    take = torch.arange(g, device=confidence.device).unsqueeze(0) < n.unsqueeze(1)
    tau = float(r + (a * take).sum())
    batch = int(r + int(n.sum()))
    return SchedulePlan(n, tau, tau * sps.at(batch), batch)
