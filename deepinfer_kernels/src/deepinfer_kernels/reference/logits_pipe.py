"""Readable per-row logits pipeline: the specification of ``process_logits`` and
``rescue_dead_rows``, one row and one token at a time, with no batched op."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from deepinfer_kernels.sampling.logits_pipe import RowTransforms


def process_logits_reference(logits: torch.Tensor, rows: Sequence[RowTransforms]) -> torch.Tensor:
    """Row by row, in vLLM's order: repetition (over prompt + history), frequency and presence
    (over history) penalties; ``logit_bias``; ``-inf`` for ``min_tokens_banned`` while the
    history is shorter than ``min_tokens``; ``-inf`` for a token that ``allowed_token_ids``
    (when given) omits or whose ``bitmask`` bit is clear (or past the mask's words); then
    each processor on ``(tuple(history), row)``."""
    out = logits.to(torch.float32).clone()
    vocab = out.shape[1]
    for b, row in enumerate(rows):
        x = [float(v) for v in out[b].tolist()]
        if row.needs_penalties:
            counts: dict[int, int] = {}
            for t in row.history:
                counts[t] = counts.get(t, 0) + 1
            for t in set(counts) | set(row.prompt_ids):
                x[t] = x[t] / row.repetition_penalty if x[t] > 0 else x[t] * row.repetition_penalty
            for t, c in counts.items():
                x[t] -= row.frequency_penalty * c + row.presence_penalty
        for t, v in (row.logit_bias or {}).items():
            if t < vocab:
                x[t] += v
        if len(row.history) < row.min_tokens:
            for t in row.min_tokens_banned:
                if t < vocab:
                    x[t] = float("-inf")
        for t in range(vocab):
            if row.allowed_token_ids is not None and t not in set(row.allowed_token_ids):
                x[t] = float("-inf")
            if row.bitmask is not None:
                words = [int(w) & 0xFFFFFFFF for w in row.bitmask.tolist()]
                if t // 32 >= len(words) or not (words[t // 32] >> (t % 32)) & 1:
                    x[t] = float("-inf")
        out[b] = torch.tensor(x, dtype=torch.float32)
        for proc in row.processors:
            out[b] = proc(tuple(row.history), out[b].clone())
    return out


def rescue_dead_rows_reference(
    logits: torch.Tensor, fallback_ids: Sequence[int | None]
) -> tuple[torch.Tensor, list[int]]:
    """A copy where each row with no finite logit allows only its fallback id (``None``: 0),
    and the indices of those rows."""
    out = logits.clone()
    dead = []
    for b in range(out.shape[0]):
        if not any(v not in (float("inf"), float("-inf")) and v == v for v in out[b].tolist()):
            dead.append(b)
            out[b] = float("-inf")
            out[b, fallback_ids[b] if fallback_ids[b] is not None else 0] = 0.0
    return out, dead
