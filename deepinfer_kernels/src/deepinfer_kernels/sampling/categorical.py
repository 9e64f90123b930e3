"""Inverse-CDF draws from unnormalised categorical rows, shared by sampling and verification.

For weights ``w`` (non-negative, one row per draw) and a uniform ``u`` in ``[0, 1)``, the token is
the smallest index ``i`` with ``cumsum(w)[i] > u * sum(w)``. Because the inequality is strict, a
zero-weight token is never returned, even for ``u == 0`` (the draw lands on the first positive
weight). When rounding leaves ``u * sum(w)`` at or above the last cumulative value, the last
positive-weight index is returned instead.
"""

from __future__ import annotations

import torch


def inverse_cdf_sample(weights: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Draw one index per row of ``weights`` ``[N, V]`` with ``uniforms`` ``[N]``; returns int64 ``[N]``.

    Rows whose weights are all zero return -1 (the caller decides what that means).
    """
    w = weights.to(torch.float32)
    cdf = torch.cumsum(w, dim=-1)
    total = cdf[:, -1:]
    target = uniforms.to(torch.float32).unsqueeze(-1) * total
    idx = torch.searchsorted(cdf, target, right=True).squeeze(-1)
    positive = w > 0
    # Index of the last positive weight: rounding at u -> 1 must never reach a zero-weight tail.
    vocab = torch.arange(w.shape[-1], device=w.device)
    last_positive = torch.where(positive, vocab, -1).amax(dim=-1)
    idx = torch.minimum(idx, last_positive)
    return torch.where(total.squeeze(-1) > 0, idx, torch.full_like(idx, -1))
