"""Inverse-CDF draws from unnormalised categorical rows, shared by sampling and verification.

For weights ``w`` (non-negative, one row per draw) and a uniform ``u`` in ``[0, 1)``, the token is
the smallest index ``i`` with ``w[i] > 0`` and ``cumsum(w)[i] > u * sum(w)``. A zero-weight token
is never returned, even for ``u == 0`` (the draw lands on the first positive weight). When
rounding leaves no such index (``u * sum(w)`` at or above the last cumulative value), the last
positive-weight index is returned. Rows without mass return -1.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

# About 1 MiB of float32 per block of rows: large enough to amortise per-op overhead, small
# enough that a block's temporaries stay in a CPU core's cache.
_CHUNK_ELEMENTS = 1 << 18


def row_chunks(rows: int, width: int) -> Iterator[slice]:
    """Slices covering ``range(rows)`` in blocks of about ``_CHUNK_ELEMENTS / width`` rows."""
    step = max(1, _CHUNK_ELEMENTS // max(width, 1))
    for start in range(0, rows, step):
        yield slice(start, min(rows, start + step))


def inverse_cdf_sample(weights: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Draw one index per row of ``weights`` ``[N, V]`` with ``uniforms`` ``[N]``; int64 ``[N]``."""
    w = weights.to(torch.float32)
    vocab = w.shape[-1]
    cdf = torch.cumsum(w, dim=-1)
    total = cdf[:, -1]
    target = (uniforms.to(torch.float32) * total).unsqueeze(-1)
    idx = torch.searchsorted(cdf, target, right=True).squeeze(-1).clamp_(max=vocab - 1)
    # With a sequential cumsum the search always lands on a positive weight; the rows where it
    # does not (rounding at u -> 1, or a parallel scan on GPU) are fixed up on their own.
    bad = w.gather(1, idx.unsqueeze(-1)).squeeze(-1) <= 0
    if bool(bad.any()):
        rows = bad.nonzero().squeeze(-1)
        sub_w, sub_cdf = w[rows], cdf[rows]
        cols = torch.arange(vocab, device=w.device)
        hit = (sub_cdf > target[rows]) & (sub_w > 0)
        first = torch.where(hit, cols, vocab).amin(dim=-1)
        last = torch.where(sub_w > 0, cols, -1).amax(dim=-1)
        idx[rows] = torch.where(first < vocab, first, last)
    return torch.where(total > 0, idx, torch.full_like(idx, -1))
