"""Sequential temperature scaling (STS) of the per-position confidence head.

The confidence head predicts ``c_k = P(draft token k accepted | tokens 1..k-1 accepted)``. The
scheduler consumes the survival ``a_k = prod_{i<=k} c_i``, so calibration targets the survival
directly: position by position, left to right, a 1-D grid search picks ``T_k`` minimising the ECE
of ``prod_{i<=k} sigmoid(logit(c_i) / T_i)`` against the empirical survival
``s_k = prod_{i<=k} accepted_i``, with ``T_1..T_{k-1}`` already fixed.
"""

from __future__ import annotations

import torch
from torch import Tensor

from deepinfer_spec.calibration.metrics import binned_ece

_EPS = 1e-6


def default_grid() -> Tensor:
    """161 temperatures spaced geometrically over [0.1, 10]; contains exactly 1.0."""
    return torch.logspace(-1.0, 1.0, 161, dtype=torch.float64)


def _logit(p: Tensor) -> Tensor:
    p = p.to(torch.float64).clamp(_EPS, 1.0 - _EPS)
    return torch.log(p) - torch.log1p(-p)


def check_confidence(confidence: Tensor, name: str = "confidence") -> None:
    """Raise unless ``confidence`` is a floating tensor of probabilities with a position axis."""
    if not isinstance(confidence, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(confidence).__name__}")
    if not confidence.is_floating_point():
        raise TypeError(f"{name} must be a floating tensor, got {confidence.dtype}")
    if confidence.dim() < 1 or confidence.shape[-1] < 1:
        raise ValueError(f"{name} must have a non-empty last (position) axis")
    if torch.isnan(confidence).any():
        raise ValueError(f"{name} must not contain NaN")
    if (confidence < 0).any() or (confidence > 1).any():
        raise ValueError(f"{name} must hold probabilities in [0, 1]")


def apply_temperatures(confidence: Tensor, temperatures: Tensor) -> Tensor:
    """Return ``sigmoid(logit(c_k) / T_k)`` for every position ``k`` (the last axis).

    Probabilities are clamped to ``[1e-6, 1 - 1e-6]`` before the logit; the result has the
    dtype and device of ``confidence``.
    """
    check_confidence(confidence)
    if not isinstance(temperatures, Tensor):
        raise TypeError("temperatures must be a torch.Tensor")
    if temperatures.shape != (confidence.shape[-1],):
        raise ValueError(
            f"temperatures must have shape ({confidence.shape[-1]},) to match confidence's "
            f"last axis, got {tuple(temperatures.shape)}"
        )
    t = temperatures.to(device=confidence.device, dtype=torch.float64)
    if not torch.isfinite(t).all() or (t <= 0).any():
        raise ValueError("temperatures must be finite and > 0")
    return torch.sigmoid(_logit(confidence) / t).to(confidence.dtype)


def survival_targets(
    accepted: Tensor, valid: Tensor | None = None
) -> tuple[Tensor, Tensor, Tensor]:
    """Empirical survival labels and the masks saying where they are known.

    Args:
        accepted: [N, G] bool (or 0/1); ``accepted[n, k]`` means draft token k passed given that
            1..k-1 did. Entries after the first rejection are ignored.
        valid: optional [N, G] bool, True where position k was actually verified (for example
            the scheduler verified only a prefix). Only its prefix-closed part is used.

    Returns:
        ``(survival, known, conditional)``: ``survival[n, k] = prod_{i<=k} accepted[n, i]``
        (float64); ``known[n, k]`` is True when that survival is observed (all of 1..k were
        verified, or a verified rejection happened at some i <= k); ``conditional[n, k]`` is True
        when 1..k-1 were verified and accepted and k was verified, i.e. where ``accepted[n, k]``
        is a sample of the conditional event the head predicts.
    """
    if not isinstance(accepted, Tensor):
        raise TypeError("accepted must be a torch.Tensor")
    if accepted.dim() != 2:
        raise ValueError(f"accepted must be [N, G], got shape {tuple(accepted.shape)}")
    if accepted.dtype != torch.bool:
        if ((accepted != 0) & (accepted != 1)).any():
            raise ValueError("accepted must be bool or hold only 0/1")
        accepted = accepted != 0
    if valid is None:
        observed = torch.ones_like(accepted)
    else:
        if not isinstance(valid, Tensor) or valid.shape != accepted.shape:
            raise ValueError("valid must be a tensor with the same shape as accepted")
        observed = torch.cumprod(valid.to(torch.int64) != 0, dim=1).bool()
    acc = accepted & observed
    survival = torch.cumprod(acc.to(torch.float64), dim=1)
    rejected_by_k = torch.cumsum((observed & ~accepted).to(torch.int64), dim=1) > 0
    known = observed | rejected_by_k
    prev_alive = torch.ones_like(accepted)
    prev_alive[:, 1:] = survival[:, :-1] > 0
    conditional = observed & prev_alive
    return survival, known, conditional


def calibrate_sts(
    confidence: Tensor,
    accepted: Tensor,
    *,
    valid: Tensor | None = None,
    grid: Tensor | None = None,
    num_bins: int = 15,
) -> Tensor:
    """Fit per-position temperatures by sequential temperature scaling.

    For ``k = 1..G`` in order: ``T_k = argmin_{T in grid} ECE(prod_{i<k} c~_i *
    sigmoid(logit(c_k) / T), s_k)`` over the rows where the survival ``s_k`` is known (see
    :func:`survival_targets`), with ``c~_i = sigmoid(logit(c_i) / T_i)`` for the already fitted
    positions. Ties in ECE go to the temperature closest to 1; a position with no known rows
    gets ``T = 1``.

    Args:
        confidence: [N, G] raw confidence-head probabilities.
        accepted: [N, G] bool acceptance outcomes (see :func:`survival_targets`).
        valid: optional [N, G] mask of verified positions.
        grid: optional 1-D tensor of candidate temperatures (> 0); default :func:`default_grid`.
        num_bins: ECE bins.

    Returns:
        temperatures [G], float32, on ``confidence``'s device.
    """
    check_confidence(confidence)
    if confidence.dim() != 2:
        raise ValueError(f"confidence must be [N, G], got shape {tuple(confidence.shape)}")
    if not isinstance(accepted, Tensor) or accepted.shape != confidence.shape:
        raise ValueError("accepted must be a tensor with the same shape as confidence")
    if not isinstance(num_bins, int) or num_bins < 1:
        raise ValueError(f"num_bins must be an int >= 1, got {num_bins!r}")
    temps_grid = default_grid() if grid is None else grid.detach().to(torch.float64).reshape(-1)
    if temps_grid.numel() == 0 or not torch.isfinite(temps_grid).all() or (temps_grid <= 0).any():
        raise ValueError("grid must be a non-empty tensor of finite temperatures > 0")
    device = confidence.device
    temps_grid = temps_grid.to(device)
    survival, known, _ = survival_targets(accepted.to(device), valid)
    logits = _logit(confidence)
    n, g = confidence.shape
    temperatures = torch.ones(g, dtype=torch.float64, device=device)
    prefix = torch.ones(n, dtype=torch.float64, device=device)  # prod of calibrated c_i, i < k
    closeness = temps_grid.log().abs()
    for k in range(g):
        rows = known[:, k]
        if rows.any():
            cand = torch.sigmoid(logits[rows, k].unsqueeze(0) / temps_grid.unsqueeze(1))
            ece = binned_ece(cand * prefix[rows].unsqueeze(0), survival[rows, k], num_bins)
            best = ece.min()
            # Prefer the least distortion among (numerically) equal minima.
            tied = ece <= best + 1e-12
            pick = torch.where(tied, closeness, torch.full_like(closeness, float("inf"))).argmin()
            temperatures[k] = temps_grid[pick]
        prefix = prefix * torch.sigmoid(logits[:, k] / temperatures[k])
    return temperatures.to(torch.float32)
