"""`DraftMask` over the engine's sequences: each one's hard constraints at its next position
(structured-output grammar, ``allowed_token_ids``, the EOS/stop-token ban before
``min_tokens``) handed to `deepinfer_spec.DraftMask`, which masks the drafter as it draws."""

from __future__ import annotations

from collections.abc import Sequence as Seq

import torch

from deepinfer.engine.sequence import Sequence
from deepinfer_spec import DraftConstraints
from deepinfer_spec import DraftMask as SpecDraftMask


def draft_constraints(seq: Sequence) -> DraftConstraints:
    """``seq``'s constraints on its next tokens (``banned_for``: drafts still under the ban)."""
    p, state = seq.params, seq.state
    if state is None:
        return DraftConstraints(allowed_token_ids=p.allowed_token_ids)
    return DraftConstraints(
        state.grammar,
        p.allowed_token_ids,
        tuple(state.early_banned or ()),
        p.min_tokens - len(seq.output_ids),
    )


class DraftMask(SpecDraftMask):
    """`deepinfer_spec.DraftMask` over ``seqs`` (its rows, in order)."""

    def __init__(self, seqs: Seq[Sequence], vocab_size: int, draft_vocab_ids: torch.Tensor | None):
        super().__init__([draft_constraints(s) for s in seqs], vocab_size, draft_vocab_ids)
