"""Readable per-row log-probability gathering and logit bias: the specification of
``gather_logprobs`` and ``apply_logit_bias``."""

from __future__ import annotations

import math

import torch


def gather_logprobs_reference(
    logprobs: torch.Tensor, token_ids: torch.Tensor, num_top: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Row by row: the chosen token's value; its rank, 1 + the count of values strictly
    greater; the ``min(num_top, V)`` ids sorted by descending value, ties by lower id (NaN
    ranks above everything)."""
    rows, vocab = logprobs.shape
    k = min(num_top, vocab)
    chosen = torch.empty(rows)
    rank = torch.empty(rows, dtype=torch.int64)
    top_ids = torch.empty(rows, k, dtype=torch.int64)
    for r in range(rows):
        values = [float(v) for v in logprobs[r].tolist()]
        token = int(token_ids[r])
        chosen[r] = values[token]
        rank[r] = 1 + sum(v > values[token] for v in values)
        key = [math.inf if math.isnan(v) else v for v in values]
        top_ids[r] = torch.tensor(sorted(range(vocab), key=lambda t: (-key[t], t))[:k])
    return chosen, rank, top_ids, logprobs.float().gather(1, top_ids)


def apply_logit_bias_reference(
    logits: torch.Tensor, token_ids: torch.Tensor, bias: torch.Tensor
) -> torch.Tensor:
    """Row by row: each id ``>= 0`` of ``token_ids[b]`` gets its ``bias[b, j]`` added."""
    out = logits.to(torch.float32).clone()
    for b in range(out.shape[0]):
        for t, v in zip(token_ids[b].tolist(), bias[b].tolist()):
            if t >= 0:
                out[b, t] += v
    return out
