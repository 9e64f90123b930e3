"""Torch path of MLA attention and the latent-cache write.

Attention loops over sequences and batches every head: one ``[H, m, R+P] x [R+P, n]`` score
matmul (the absorbed and rotary query parts are concatenated, so the latent row is read as
both key and value), fp32 math. Exact: no key splitting on CPU.
"""

from __future__ import annotations

import torch


def mla_attention_torch(
    q_nope: torch.Tensor,
    q_rope: torch.Tensor,
    latent_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    scale: float,
    causal: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    total_q, heads, rank = q_nope.shape
    out = torch.zeros(total_q, heads, rank, dtype=torch.float32, device=q_nope.device)
    lse = torch.full((total_q, heads), float("-inf"), dtype=torch.float32, device=q_nope.device)
    block_size, width = latent_cache.shape[1], latent_cache.shape[2]
    q = torch.cat([q_nope, q_rope], dim=-1).float().transpose(0, 1).contiguous()  # [H, Tq, R+P]
    cu = cu_seqlens_q.tolist()
    for b, n in enumerate(seq_lens.tolist()):
        start, end = cu[b], cu[b + 1]
        if end == start or n == 0:
            continue
        used = (n + block_size - 1) // block_size
        c = latent_cache[block_table[b, :used].long()].reshape(-1, width)[:n].float()
        scores = torch.matmul(q[:, start:end], c.t()) * scale  # [H, m, n]
        if causal and end - start > 1:
            m = end - start
            pos = torch.arange(n - m, n, device=c.device)[:, None]
            keep = torch.arange(n, device=c.device)[None, :] <= pos
            scores = scores.masked_fill(~keep, float("-inf"))
        row_lse = torch.logsumexp(scores, dim=-1)
        probs = torch.exp(scores - row_lse[..., None])
        out[start:end] = torch.matmul(probs, c[:, :rank]).transpose(0, 1)
        lse[start:end] = row_lse.transpose(0, 1)
    return out.to(q_nope.dtype), lse


def write_latent_kv_torch(
    kv_latent: torch.Tensor,
    k_rope: torch.Tensor,
    latent_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    block_size = latent_cache.shape[1]
    s = slot_mapping.to(torch.int64)
    # Out-of-range slots are skipped like -1, so an unchecked call never writes out of bounds.
    valid = (s >= 0) & (s < latent_cache.shape[0] * block_size)
    slots = s[valid]
    rows = torch.cat([kv_latent[valid], k_rope[valid]], dim=-1).to(latent_cache.dtype)
    latent_cache[slots // block_size, slots % block_size] = rows
