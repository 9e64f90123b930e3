"""Vectorised torch paths for verification (no Python loop over the batch).

They compute exactly what ``reference.verify`` computes, from the same uniforms.
"""

from __future__ import annotations

import torch

from deepinfer_kernels.sampling.categorical import inverse_cdf_sample


def _leading_true_count(mask: torch.Tensor) -> torch.Tensor:
    """Length of the run of True at the start of each row of ``mask`` ``[B, G]``."""
    if mask.shape[1] == 0:
        return torch.zeros(mask.shape[0], dtype=torch.int64, device=mask.device)
    return torch.cumprod(mask.to(torch.int64), dim=1).sum(dim=1)


def _assemble(
    draft_token_ids: torch.Tensor, num_accepted: torch.Tensor, last_token: torch.Tensor
) -> torch.Tensor:
    """``[B, G+1]``: accepted drafts, then ``last_token`` at ``num_accepted``, then -1."""
    batch, gamma = draft_token_ids.shape
    positions = torch.arange(gamma + 1, device=draft_token_ids.device)[None, :]
    padded = torch.cat(
        [
            draft_token_ids.to(torch.int64),
            torch.full((batch, 1), -1, dtype=torch.int64, device=draft_token_ids.device),
        ],
        dim=1,
    )
    out = torch.where(positions < num_accepted[:, None], padded, -1)
    return torch.where(positions == num_accepted[:, None], last_token[:, None], out)


def speculative_verify_torch(
    draft_token_ids: torch.Tensor,
    draft_probs: torch.Tensor | None,
    target_probs: torch.Tensor,
    num_draft_tokens: torch.Tensor,
    accept_uniforms: torch.Tensor,
    sample_uniforms: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """See ``reference.verify.speculative_verify_reference`` for the algorithm."""
    batch, gamma = draft_token_ids.shape
    device = target_probs.device
    rows = torch.arange(batch, device=device)
    n = num_draft_tokens.to(torch.int64)
    verified = torch.arange(gamma, device=device)[None, :] < n[:, None]
    # Padding ids (-1 or garbage) beyond n must not index memory: read token 0 there instead.
    safe_ids = torch.where(verified, draft_token_ids.to(torch.int64), 0)

    p_t = target_probs[:, :gamma].gather(-1, safe_ids.unsqueeze(-1)).squeeze(-1).float()
    if draft_probs is None:
        p_d = torch.ones_like(p_t)
    else:
        p_d = draft_probs.gather(-1, safe_ids.unsqueeze(-1)).squeeze(-1).float()
    accept = verified & (accept_uniforms.float() * p_d < p_t)
    num_accepted = _leading_true_count(accept)

    stop = num_accepted  # position of the corrected / bonus token, in [0, n]
    p_t_row = target_probs[rows, stop].float()
    rejected = stop < n
    if gamma > 0:
        draft_pos = torch.clamp(stop, max=gamma - 1)
        if draft_probs is None:
            draft_tok = safe_ids[rows, draft_pos]
            p_d_row = torch.nn.functional.one_hot(draft_tok, p_t_row.shape[-1]).float()
        else:
            p_d_row = draft_probs[rows, draft_pos].float()
        residual = torch.clamp(p_t_row - p_d_row, min=0.0)
        # p_t == p_d up to rounding leaves no residual mass; fall back to p_t itself.
        has_mass = residual.sum(dim=-1, keepdim=True) > 0
        residual = torch.where(has_mass, residual, p_t_row)
        weights = torch.where(rejected[:, None], residual, p_t_row)
    else:
        weights = p_t_row
    last = inverse_cdf_sample(weights, sample_uniforms)
    out = _assemble(draft_token_ids, num_accepted, last)
    return out, num_accepted, num_accepted + 1


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
