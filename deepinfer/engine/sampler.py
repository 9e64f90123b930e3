"""Turning a batch of logits into next tokens with each request's own `SamplingParams`."""

from __future__ import annotations

from collections.abc import Sequence as Seq

import torch

from deepinfer.engine.sampling_params import SamplingParams
from deepinfer.engine.sequence import Sequence
from deepinfer_kernels import sample


def sampling_tensors(
    params: Seq[SamplingParams], repeat: int = 1
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-row ``temperature, top_k, top_p, min_p`` tensors, each request's row repeated
    ``repeat`` times (a verify block scores ``repeat`` positions of one request)."""

    def column(values: list[float] | list[int], dtype: torch.dtype) -> torch.Tensor:
        return torch.tensor(values, dtype=dtype).repeat_interleave(repeat)

    return (
        column([p.temperature for p in params], torch.float32),
        column([p.top_k for p in params], torch.int64),
        column([p.top_p for p in params], torch.float32),
        column([p.min_p for p in params], torch.float32),
    )


def sample_next_tokens(
    seqs: Seq[Sequence], logits: torch.Tensor, shared: torch.Generator
) -> list[int]:
    """One token per row of ``logits``; seeded requests draw from their own generator, the rest
    from ``shared``."""
    if seqs and all(s.params.temperature == 0 for s in seqs):
        # All greedy (no draw, so no generator matters): one pass over the logits gives each
        # row's first maximal index, as ``sample`` picks, and its maximum, which is NaN or
        # +inf for rows that ``sample`` rejects; those take the full path and its error.
        best, index = logits.float().max(dim=-1)
        if bool(torch.isfinite(best).all()):
            return [int(t) for t in index.tolist()]
    out: list[int] = [0] * len(seqs)
    unseeded = [i for i, s in enumerate(seqs) if s.generator is None]
    groups: list[tuple[list[int], torch.Generator]] = []
    if unseeded:
        groups.append((unseeded, shared))
    groups.extend(([i], s.generator) for i, s in enumerate(seqs) if s.generator is not None)
    for rows, gen in groups:
        drawn = sample(
            logits[rows].float().cpu(),
            *sampling_tensors([seqs[i].params for i in rows]),
            generator=gen,
        )
        for i, token in zip(rows, drawn.tolist()):
            out[i] = int(token)
    return out
