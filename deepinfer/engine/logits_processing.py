"""Rewriting a batch of logits with each request's penalties, bias, bans, masks and processors.

One row of logits belongs to one request at one position; ``history`` is what that request
has generated before the position (its output so far, plus draft tokens inside a speculative
verify block). Rows of requests that rewrite nothing are returned untouched, so plain requests
pay nothing; the others go, in vLLM's order, through

1. ``apply_penalties`` (repetition over prompt + history, frequency and presence over history),
2. ``logit_bias``, then ``allowed_token_ids``,
3. the ban on EOS / stop tokens while fewer than ``min_tokens`` tokens are out,
4. the structured-output token mask (``apply_token_bitmask``),
5. the request's own ``logits_processors``.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq
from dataclasses import dataclass

import torch

from deepinfer.engine.sequence import Sequence
from deepinfer_kernels import apply_penalties, apply_token_bitmask
from deepinfer_kernels.sampling import pad_token_ids


@dataclass
class Row:
    """One logits row to process: its request, what came before it, its grammar mask."""

    seq: Sequence
    history: list[int]
    bitmask: torch.Tensor | None = None  # int32 [W] from the request's grammar


def needs_processing(seq: Sequence) -> bool:
    return seq.params.needs_processing


def process_rows(rows: Seq[Row], logits: torch.Tensor) -> torch.Tensor:
    """Float32 ``[R, V]`` logits after each row's processing (``logits`` is not modified)."""
    out = logits.float().clone()
    vocab = out.shape[1]
    pen = [i for i, r in enumerate(rows) if r.seq.params.needs_penalties]
    if pen:
        idx = torch.tensor(pen)
        ps = [rows[i].seq.params for i in pen]
        out[idx] = apply_penalties(
            out[idx],
            pad_token_ids([rows[i].seq.prompt_ids for i in pen]),
            pad_token_ids([rows[i].history for i in pen]),
            torch.tensor([p.presence_penalty for p in ps], dtype=torch.float32),
            torch.tensor([p.frequency_penalty for p in ps], dtype=torch.float32),
            torch.tensor([p.repetition_penalty for p in ps], dtype=torch.float32),
        )
    for i, r in enumerate(rows):
        p = r.seq.params
        if p.logit_bias:
            ids = torch.tensor([t for t in p.logit_bias if t < vocab], dtype=torch.int64)
            vals = torch.tensor([v for t, v in p.logit_bias.items() if t < vocab])
            out[i].index_add_(0, ids, vals)
        if p.allowed_token_ids is not None:
            keep = torch.zeros(vocab, dtype=torch.bool)
            keep[[t for t in p.allowed_token_ids if t < vocab]] = True
            out[i].masked_fill_(~keep, float("-inf"))
        state = r.seq.state
        if state is not None and state.early_banned and len(r.history) < p.min_tokens:
            out[i, [t for t in state.early_banned if t < vocab]] = float("-inf")
    masked = [i for i, r in enumerate(rows) if r.bitmask is not None]
    if masked:
        idx = torch.tensor(masked)
        bits = torch.stack([_fit(rows[i].bitmask, vocab) for i in masked])  # type: ignore[arg-type]
        out[idx] = apply_token_bitmask(out[idx], bits)
    for i, r in enumerate(rows):
        for proc in r.seq.params.logits_processors:
            result = proc(tuple(r.history), out[i])
            if not isinstance(result, torch.Tensor) or tuple(result.shape) != (vocab,):
                raise ValueError(
                    f"logits_processors: {proc!r} must return a tensor of shape ({vocab},)"
                )
            out[i] = result
    return out


def _fit(bitmask: torch.Tensor, vocab: int) -> torch.Tensor:
    """A grammar mask widened with zero words (disallowed) when the model's vocabulary has
    rows past the tokenizer's."""
    words = -(-vocab // 32)
    if bitmask.shape[0] >= words:
        return bitmask
    return torch.cat([bitmask, torch.zeros(words - bitmask.shape[0], dtype=torch.int32)])


def rows_for_step(seqs: Seq[Sequence]) -> list[Row]:
    """One row per sequence at its next position (the plain decode / end-of-prefill case)."""
    rows = []
    for s in seqs:
        grammar = s.state.grammar if s.state is not None else None
        rows.append(Row(s, list(s.output_ids), grammar.bitmask() if grammar is not None else None))
    return rows


def rows_for_block(seq: Sequence, drafts: Seq[int], width: int) -> list[Row]:
    """``width`` rows of one verify block: row ``j`` follows the first ``j`` drafts."""
    grammar = seq.state.grammar if seq.state is not None else None
    masks = grammar.masks_along(drafts, width) if grammar is not None else None
    base = list(seq.output_ids)
    return [
        Row(
            seq,
            base + [int(t) for t in drafts[: min(j, len(drafts))]],
            None if masks is None else masks[j],
        )
        for j in range(width)
    ]
