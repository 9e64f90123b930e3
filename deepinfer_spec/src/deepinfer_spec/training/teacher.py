"""The frozen target's output reduced to what the training loss reads from it for a drafter
with a draft vocabulary.

With a draft vocabulary ``S`` the loss needs the target's probabilities only on ``S`` (and the
mass outside it, ``1 - sum_S p_t``). Reading them out of the full ``[B, T, V]`` logits costs a
softmax over ``V`` and a gather of ``V``-wide rows for every block position of every step; on a
CPU with ``V = 49152`` and ``|S| = 16384`` that was ~0.6 s of a ~1.9 s training step. Reduced
once per target forward (which ``train_drafter`` reuses for several steps), a step reads
``|S|``-wide rows of log-probabilities instead. Same values: ``log p_t(s) = z_s - logsumexp(z)``
over the full vocabulary, so the outside mass is unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from deepinfer_spec.adapter import TargetOutput


@dataclass(frozen=True)
class DraftVocabTeacher:
    """``features [B, T, F]`` as the target returned them; ``log_probs [B, T, |S|]``: the
    target's next-token log-probabilities (normalised over its full vocabulary) at the draft
    vocabulary ``draft_vocab_ids`` (in draft-index order)."""

    features: torch.Tensor
    log_probs: torch.Tensor
    draft_vocab_ids: torch.Tensor

    def __post_init__(self) -> None:
        if self.log_probs.shape[:2] != self.features.shape[:2]:
            raise ValueError(
                f"log_probs: expected [B, T] = {tuple(self.features.shape[:2])} leading dims, "
                f"got {tuple(self.log_probs.shape)}"
            )
        if self.log_probs.shape[-1] != self.draft_vocab_ids.numel():
            raise ValueError(
                f"draft_vocab_ids: {self.draft_vocab_ids.numel()} ids for "
                f"{self.log_probs.shape[-1]} log-probabilities per position"
            )

    @classmethod
    def from_target(cls, out: TargetOutput, draft_vocab_ids: torch.Tensor) -> DraftVocabTeacher:
        """Reduce ``out`` (the target's ``score``) to ``draft_vocab_ids``."""
        if draft_vocab_ids.dim() != 1 or draft_vocab_ids.numel() == 0:
            raise ValueError("draft_vocab_ids: expected a non-empty 1-D tensor of token ids")
        with torch.no_grad():
            logits = out.logits.detach().float()
            ids = draft_vocab_ids.to(logits.device)
            log_probs = logits[..., ids] - torch.logsumexp(logits, dim=-1, keepdim=True)
        return cls(features=out.features.detach(), log_probs=log_probs, draft_vocab_ids=ids)
