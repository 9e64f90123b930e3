"""Vectorised torch paths for verification (no Python loop over the batch).

They compute exactly what ``reference.verify`` computes, from the same uniforms. Only the rows a
token is drawn from are materialised (one per request), so the cost is ``O(B * V)`` regardless
of the draft length; they are processed in blocks of rows that fit in cache (``row_chunks``),
which on CPU is several times faster than streaming ``[B, V]`` temporaries through memory.
"""

from __future__ import annotations

import torch

from deepinfer_kernels.sampling.categorical import inverse_cdf_sample, row_chunks
from deepinfer_kernels.verify.validate import (
    ERR_DRAFT,
    ERR_EMPTY,
    ERR_TARGET,
    raise_for_flags,
)


def _leading_true_count(mask: torch.Tensor) -> torch.Tensor:
    """Length of the run of True at the start of each row of ``mask`` ``[B, G]``."""
    if mask.shape[1] == 0:
        return torch.zeros(mask.shape[0], dtype=torch.int64, device=mask.device)
    return torch.cumprod(mask.to(torch.int64), dim=1).sum(dim=1)


def _assemble(
    draft_token_ids: torch.Tensor, num_accepted: torch.Tensor, last_token: torch.Tensor
) -> torch.Tensor:
    """``[B, G+1]``: accepted drafts, then ``last_token`` at ``num_accepted``, then -1."""
    batch, _ = draft_token_ids.shape
    device = draft_token_ids.device
    padded = torch.cat(
        [
            draft_token_ids.to(torch.int64),
            torch.full((batch, 1), -1, dtype=torch.int64, device=device),
        ],
        dim=1,
    )
    positions = torch.arange(padded.shape[1], device=device)[None, :]
    out = torch.where(positions < num_accepted[:, None], padded, -1)
    return torch.where(positions == num_accepted[:, None], last_token[:, None], out)


def _bad(values: torch.Tensor) -> bool:
    """NaN, infinite or negative entries (one min/max pass; NaN propagates through both)."""
    if values.numel() == 0:
        return False
    lo, hi = torch.aminmax(values)
    return bool(torch.isnan(lo) | (lo < 0) | torch.isinf(hi))


def speculative_verify_torch(
    draft_token_ids: torch.Tensor,
    draft_probs: torch.Tensor | None,
    target_probs: torch.Tensor,
    num_draft_tokens: torch.Tensor,
    accept_uniforms: torch.Tensor,
    sample_uniforms: torch.Tensor,
    check_values: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """See ``reference.verify.speculative_verify_reference`` for the algorithm.

    With ``check_values`` every probability that is read (the two scalars per verified draft
    and the rows a token is drawn from) must be finite and non-negative, and a drawn-from row
    must have mass; otherwise ``ValueError``.
    """
    batch, gamma = draft_token_ids.shape
    device = target_probs.device
    n = num_draft_tokens.to(torch.int64)
    vocab = target_probs.shape[-1]
    verified = torch.arange(gamma, device=device)[None, :] < n[:, None]
    ids64 = draft_token_ids.to(torch.int64)
    # An unchecked id outside [0, V) is rejected like a target zero; it and the padding
    # (-1 or garbage beyond n) must not index memory: read token 0 there instead.
    in_vocab = (ids64 >= 0) & (ids64 < vocab)
    safe_ids = torch.where(verified & in_vocab, ids64, 0)

    p_t = target_probs[:, :gamma].gather(-1, safe_ids.unsqueeze(-1)).squeeze(-1).float()
    if draft_probs is None:
        p_d = torch.ones_like(p_t)
    else:
        p_d = draft_probs.gather(-1, safe_ids.unsqueeze(-1)).squeeze(-1).float()
    flags = 0
    if check_values:
        flags |= ERR_TARGET if _bad(p_t[verified]) else 0
        flags |= ERR_DRAFT if _bad(p_d[verified]) else 0
    accept = verified & in_vocab & (accept_uniforms.float() * p_d < p_t)
    num_accepted = _leading_true_count(accept)

    stop = num_accepted  # position of the corrected / bonus token, in [0, n]
    rejected = stop < n
    token = torch.empty(batch, dtype=torch.int64, device=device)
    for rows_c in row_chunks(batch, target_probs.shape[-1]):
        token[rows_c], bits = _draw_rows(
            draft_probs,
            target_probs,
            torch.where(in_vocab, safe_ids, -1),
            stop,
            rejected,
            sample_uniforms,
            rows_c,
            check_values,
        )
        flags |= bits
    raise_for_flags(flags)
    out = _assemble(draft_token_ids, num_accepted, token)
    return out, num_accepted, num_accepted + 1


def _rows_at(probs: torch.Tensor, req: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """``probs[req, pos]`` as a fresh float32 ``[len(req), V]`` tensor.

    Copies whole rows with ``index_select`` when the first two dims flatten to a view; CPU
    advanced indexing with two index tensors is an order of magnitude slower.
    """
    if probs.stride(0) == probs.shape[1] * probs.stride(1):
        flat = probs.flatten(0, 1)
        rows = torch.index_select(flat, 0, req * probs.shape[1] + pos)
    else:
        rows = probs[req, pos]
    return rows.to(torch.float32)  # both branches made a fresh tensor: safe to edit in place


def _draw_rows(
    draft_probs: torch.Tensor | None,
    target_probs: torch.Tensor,
    safe_ids: torch.Tensor,
    stop: torch.Tensor,
    rejected: torch.Tensor,
    uniforms: torch.Tensor,
    rows: slice,
    check_values: bool,
) -> tuple[torch.Tensor, int]:
    """The corrected / bonus token for the requests in ``rows``, and the error bits.

    Bonus rows draw from ``p_t``; rejected rows from ``max(0, p_t - p_d)``. The two groups are
    drawn separately so no row is copied more than once.
    """
    flags = 0
    idx = torch.arange(rows.start, rows.stop, device=target_probs.device)
    token = torch.empty(idx.shape[0], dtype=torch.int64, device=idx.device)
    rej_mask = rejected[rows]
    bonus = (~rej_mask).nonzero().squeeze(-1)
    rej = rej_mask.nonzero().squeeze(-1)
    if bonus.numel():
        p_t_rows = _rows_at(target_probs, idx[bonus], stop[idx[bonus]])
        if check_values and _bad(p_t_rows):
            flags |= ERR_TARGET
        token[bonus] = inverse_cdf_sample(p_t_rows, uniforms[idx[bonus]])
    if rej.numel():
        r_idx = idx[rej]
        pos = stop[r_idx]
        residual = _rows_at(target_probs, r_idx, pos)
        if check_values and _bad(residual):
            flags |= ERR_TARGET
        if draft_probs is None:
            # One-hot draft at its token; an out-of-vocabulary token (-1 here) has no column.
            tok = safe_ids[r_idx, pos]
            local = torch.arange(rej.numel(), device=idx.device)[tok >= 0]
            tok = tok[tok >= 0]
            residual[local, tok] = (residual[local, tok] - 1.0).clamp_(min=0.0)
        else:
            p_d_rows = _rows_at(draft_probs, r_idx, pos)
            if check_values and _bad(p_d_rows):
                flags |= ERR_DRAFT
            residual.sub_(p_d_rows).clamp_(min=0.0)
        drawn = inverse_cdf_sample(residual, uniforms[r_idx])
        empty = (drawn < 0).nonzero().squeeze(-1)
        if empty.numel():
            # A residual without mass (p_t == p_d up to rounding): draw from p_t itself.
            e_rows = r_idx[empty]
            drawn[empty] = inverse_cdf_sample(
                _rows_at(target_probs, e_rows, stop[e_rows]), uniforms[e_rows]
            )
        token[rej] = drawn
    if check_values and bool((token < 0).any()):
        flags |= ERR_EMPTY
    return token, flags


def greedy_verify_torch(
    draft_token_ids: torch.Tensor, target_logits: torch.Tensor, num_draft_tokens: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Accept while the draft equals the target argmax (ties: lowest id), then emit the argmax."""
    batch, gamma = draft_token_ids.shape
    device = target_logits.device
    # torch.argmax returns the first maximal index, which is the tie rule we document.
    best = torch.argmax(target_logits, dim=-1).to(torch.int64)  # [B, G+1]
    n = num_draft_tokens.to(torch.int64)
    verified = torch.arange(gamma, device=device)[None, :] < n[:, None]
    match = verified & (draft_token_ids.to(torch.int64) == best[:, :gamma])
    num_accepted = _leading_true_count(match)
    last = best[torch.arange(batch, device=device), num_accepted]
    out = _assemble(draft_token_ids, num_accepted, last)
    return out, num_accepted, num_accepted + 1
