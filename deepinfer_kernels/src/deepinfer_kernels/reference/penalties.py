"""Readable per-row penalties and token masks: the specification of ``apply_penalties`` and
``apply_token_bitmask``."""

from __future__ import annotations

import torch


def apply_penalties_reference(
    logits: torch.Tensor,
    prompt_ids: torch.Tensor,
    output_ids: torch.Tensor,
    presence_penalty: torch.Tensor,
    frequency_penalty: torch.Tensor,
    repetition_penalty: torch.Tensor,
) -> torch.Tensor:
    """Row by row, token by token (ids ``< 0`` are padding):

    * repetition (CTRL): a token seen in the prompt or the output has its logit divided by
      ``repetition_penalty`` when positive, multiplied by it otherwise;
    * frequency: minus ``frequency_penalty`` times the token's count in the output;
    * presence: minus ``presence_penalty`` once if the token occurs in the output.
    """
    out = logits.to(torch.float32).clone()
    for b in range(out.shape[0]):
        counts: dict[int, int] = {}
        for t in output_ids[b].tolist():
            if t >= 0:
                counts[t] = counts.get(t, 0) + 1
        seen = set(counts) | {t for t in prompt_ids[b].tolist() if t >= 0}
        rep = float(repetition_penalty[b])
        for t in seen:
            v = float(out[b, t])
            out[b, t] = v / rep if v > 0 else v * rep
        for t, c in counts.items():
            out[b, t] -= float(frequency_penalty[b]) * c + float(presence_penalty[b])
    return out


def apply_token_bitmask_reference(logits: torch.Tensor, bitmask: torch.Tensor) -> torch.Tensor:
    """Token ``i`` of row ``b`` keeps its logit when bit ``i % 32`` of ``bitmask[b, i // 32]`` is
    set (the layout llguidance and xgrammar fill); otherwise it becomes ``-inf``."""
    out = logits.to(torch.float32).clone()
    for b in range(out.shape[0]):
        words = [int(w) & 0xFFFFFFFF for w in bitmask[b].tolist()]
        for i in range(out.shape[1]):
            if not (words[i // 32] >> (i % 32)) & 1:
                out[b, i] = float("-inf")
    return out
