"""The engine's side of logits processing: each request's params as a kernel pipeline row.

The rewrites themselves (penalties, bias, ``min_tokens`` bans, allowed ids and grammar masks,
the request's own processors, in vLLM's order) are ``deepinfer_kernels.sampling``'s
``process_logits``; this module only says, per row, what a request asks for at a position:
``history`` is what the request generated before it (its output so far, plus draft tokens
inside a speculative verify block) and the mask is its grammar's at that position.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq

import torch

from deepinfer.engine.sequence import Sequence
from deepinfer_kernels.sampling import RowTransforms


def row_transforms(
    seq: Sequence, history: list[int], bitmask: torch.Tensor | None
) -> RowTransforms:
    """One pipeline row of ``seq`` after ``history``, with its grammar's ``bitmask``."""
    p, state = seq.params, seq.state
    return RowTransforms(
        history=history,
        prompt_ids=seq.prompt_ids,
        presence_penalty=p.presence_penalty,
        frequency_penalty=p.frequency_penalty,
        repetition_penalty=p.repetition_penalty,
        logit_bias=p.logit_bias,
        min_tokens=p.min_tokens,
        min_tokens_banned=state.early_banned if state is not None else (),
        allowed_token_ids=p.allowed_token_ids,
        bitmask=bitmask,
        processors=p.logits_processors,
    )


def rows_for_step(seqs: Seq[Sequence]) -> list[RowTransforms]:
    """One row per sequence at its next position (the plain decode / end-of-prefill case)."""
    rows = []
    for s in seqs:
        grammar = s.state.grammar if s.state is not None else None
        mask = grammar.bitmask() if grammar is not None else None
        rows.append(row_transforms(s, list(s.output_ids), mask))
    return rows


def rows_for_block(seq: Sequence, drafts: Seq[int], width: int) -> list[RowTransforms]:
    """``width`` rows of one verify block: row ``j`` follows the first ``j`` drafts."""
    grammar = seq.state.grammar if seq.state is not None else None
    masks = grammar.masks_along(drafts, width) if grammar is not None else None
    base = list(seq.output_ids)
    return [
        row_transforms(
            seq,
            base + [int(t) for t in drafts[: min(j, len(drafts))]],
            None if masks is None else masks[j],
        )
        for j in range(width)
    ]
