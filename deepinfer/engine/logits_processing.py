"""Rewriting a batch of logits with each request's penalties, bias, bans, masks and processors.

One row of logits belongs to one request at one position; ``history`` is what that request
has generated before the position (its output so far, plus draft tokens inside a speculative
verify block). Rows of requests that rewrite nothing are returned untouched, so plain requests
pay nothing; the others go, in vLLM's order, through

1. ``apply_penalties`` (repetition over prompt + history, frequency and presence over history),
2. ``logit_bias`` and the ban on EOS / stop tokens while fewer than ``min_tokens`` tokens are
   out (one ``apply_logit_bias``),
3. ``allowed_token_ids`` and the structured-output grammar (one ``apply_token_bitmask``),
4. the request's own ``logits_processors``.

Additive bias and masks commute (a masked token stays ``-inf`` whatever is added), so this is
the same result as vLLM's bias, allowed ids, bans, grammar order.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq
from dataclasses import dataclass

import torch

from deepinfer.engine.sequence import Sequence
from deepinfer_kernels import apply_logit_bias, apply_penalties, apply_token_bitmask
from deepinfer_kernels.sampling import pad_token_ids, token_bitmask


@dataclass
class Row:
    """One logits row to process: its request, what came before it, its grammar mask."""

    seq: Sequence
    history: list[int]
    bitmask: torch.Tensor | None = None  # int32 [W] from the request's grammar


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
    # logit_bias and the EOS / stop-token ban before min_tokens are one sparse addition.
    bias = [_bias_entries(r, vocab) for r in rows]
    if any(bias):
        width = max(len(b) for b in bias)
        ids = pad_token_ids([[t for t, _ in b] for b in bias])
        amounts = torch.tensor([[v for _, v in b] + [0.0] * (width - len(b)) for b in bias])
        out = apply_logit_bias(out, ids, amounts.reshape(ids.shape))
    # allowed_token_ids and the grammar are one token mask (their intersection).
    masks = [_token_mask(r, vocab) for r in rows]
    masked = [i for i, m in enumerate(masks) if m is not None]
    if masked:
        idx = torch.tensor(masked)
        out[idx] = apply_token_bitmask(out[idx], torch.stack([masks[i] for i in masked]))  # type: ignore[misc]
    for i, r in enumerate(rows):
        for proc in r.seq.params.logits_processors:
            result = proc(tuple(r.history), out[i])
            if not isinstance(result, torch.Tensor) or tuple(result.shape) != (vocab,):
                raise ValueError(
                    f"logits_processors: {proc!r} must return a tensor of shape ({vocab},)"
                )
            out[i] = result
    return out


def _bias_entries(row: Row, vocab: int) -> list[tuple[int, float]]:
    """(token id, amount) pairs of one row: its ``logit_bias``, then ``-inf`` for each token
    banned while fewer than ``min_tokens`` are out (ids past the model's vocabulary skipped)."""
    p, state = row.seq.params, row.seq.state
    entries = [(t, v) for t, v in (p.logit_bias or {}).items() if t < vocab]
    if state is not None and state.early_banned and len(row.history) < p.min_tokens:
        entries += [(t, float("-inf")) for t in state.early_banned if t < vocab]
    return entries


def _token_mask(row: Row, vocab: int) -> torch.Tensor | None:
    """int32 ``[ceil(V / 32)]`` of the tokens the row's grammar and ``allowed_token_ids``
    permit; ``None`` when neither restricts it. A grammar mask narrower than the model's
    vocabulary (rows past the tokenizer's) is widened with zero words: disallowed."""
    allowed = row.seq.params.allowed_token_ids
    mask = None if allowed is None else token_bitmask(list(allowed), vocab)
    if row.bitmask is not None:
        words = -(-vocab // 32)
        grammar = row.bitmask[:words]
        if grammar.shape[0] < words:
            grammar = torch.cat([grammar, torch.zeros(words - grammar.shape[0], dtype=torch.int32)])
        mask = grammar if mask is None else mask & grammar
    return mask


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
