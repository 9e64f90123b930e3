"""Readable per-request loops for speculative and greedy verification: the specification.

The randomness is passed in explicitly so that the fast paths can be checked draw for draw:
``accept_uniforms[b, k]`` decides draft ``k`` of request ``b`` and ``sample_uniforms[b]`` draws the
single corrected or bonus token (inverse CDF, see ``sampling.categorical``).
"""

from __future__ import annotations

import torch

from deepinfer_kernels.sampling.categorical import inverse_cdf_sample


def speculative_verify_reference(
    draft_token_ids: torch.Tensor,
    draft_probs: torch.Tensor | None,
    target_probs: torch.Tensor,
    num_draft_tokens: torch.Tensor,
    accept_uniforms: torch.Tensor,
    sample_uniforms: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Lossless rejection sampling, one request at a time.

    For request ``b`` with ``n = num_draft_tokens[b]`` drafts ``x_0..x_{n-1}``:

    * draft ``k`` is accepted iff ``u_k * p_d(x_k) < p_t(x_k)`` (``u_k`` in ``[0, 1)``), which is
      acceptance with probability ``min(1, p_t / p_d)`` written without a division; a token the
      target gives zero probability is never accepted, even for ``u_k == 0``;
    * at the first rejection ``k`` one token is drawn from ``max(0, p_t[k] - p_d[k])``
      (normalised); if that residual is all zero (``p_t == p_d`` up to rounding) it is drawn
      from ``p_t[k]``;
    * if all ``n`` drafts pass, a bonus token is drawn from ``p_t[n]``.

    ``draft_probs=None`` means a deterministic draft (one-hot at ``x_k``). Returns
    ``(output_ids [B, G+1] int64 padded with -1, num_accepted [B], num_emitted [B])``.
    """
    batch, gamma = draft_token_ids.shape
    out = torch.full((batch, gamma + 1), -1, dtype=torch.int64)
    num_accepted = torch.zeros(batch, dtype=torch.int64)
    for b in range(batch):
        n = int(num_draft_tokens[b])
        k = 0
        while k < n:
            x = int(draft_token_ids[b, k])
            p_t = float(target_probs[b, k, x])
            p_d = 1.0 if draft_probs is None else float(draft_probs[b, k, x])
            if float(accept_uniforms[b, k]) * p_d < p_t:
                out[b, k] = x
                k += 1
            else:
                break
        p_t_row = target_probs[b, k].to(torch.float32)
        if k < n:
            if draft_probs is None:
                p_d_row = torch.zeros_like(p_t_row)
                p_d_row[int(draft_token_ids[b, k])] = 1.0
            else:
                p_d_row = draft_probs[b, k].to(torch.float32)
            row = torch.clamp(p_t_row - p_d_row, min=0.0)
            if float(row.sum()) <= 0.0:
                row = p_t_row
        else:
            row = p_t_row
        token = inverse_cdf_sample(row[None], sample_uniforms[b : b + 1])[0]
        out[b, k] = token
        num_accepted[b] = k
    return out, num_accepted, num_accepted + 1


def greedy_verify_reference(
    draft_token_ids: torch.Tensor, target_logits: torch.Tensor, num_draft_tokens: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Accept drafts while each equals the target's argmax (ties: lowest id), then emit the
    target argmax at the first mismatch (or at position ``n`` as the bonus token)."""
    batch, gamma = draft_token_ids.shape
    out = torch.full((batch, gamma + 1), -1, dtype=torch.int64)
    num_accepted = torch.zeros(batch, dtype=torch.int64)
    for b in range(batch):
        n = int(num_draft_tokens[b])
        k = 0
        while k <= n:
            best = _first_argmax(target_logits[b, k])
            out[b, k] = best
            if k == n or int(draft_token_ids[b, k]) != best:
                break
            k += 1
        num_accepted[b] = k
    return out, num_accepted, num_accepted + 1


def _first_argmax(row: torch.Tensor) -> int:
    values = row.to(torch.float32).tolist()
    best = 0
    for i, v in enumerate(values):
        if v > values[best]:
            best = i
    return best
