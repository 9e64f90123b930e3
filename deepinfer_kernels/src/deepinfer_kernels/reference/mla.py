"""Reference multi-head latent attention (MLA, DeepSeek-V2/V3) over a paged latent cache.

The cache holds one latent row per position, ``c = [c_kv (kv_lora_rank R) | k_rope (P)]``,
shared by every query head. With the key up-projection absorbed into the query
(``q_nope_absorbed = q_nope @ W_UK``, ``[tokens, H, R]``) and the rotary part ``q_rope``
(``[tokens, H, P]``), for sequence ``b`` with ``n = seq_lens[b]`` positions and ``m`` queries
(query ``i`` at position ``p = n - m + i``)::

    s_j   = scale * (<q_nope_absorbed, c_kv_j> + <q_rope, k_rope_j>)
    keep j iff  j < n  and  j <= p (if causal)
    lse   = log sum_{kept j} exp(s_j)                (natural log, fp32)
    o     = sum_{kept j} exp(s_j - lse) * c_kv_j     (``[tokens, H, R]``; the caller applies W_UV)

Math in fp32, output in the query dtype. Loops over sequences: meant to be read, not fast.
"""

from __future__ import annotations

import torch


def gather_latent(cache: torch.Tensor, block_table_row: torch.Tensor, seq_len: int) -> torch.Tensor:
    """The first ``seq_len`` latent rows of one sequence, ``[seq_len, R + P]``."""
    block_size = cache.shape[1]
    used = (seq_len + block_size - 1) // block_size
    return cache[block_table_row[:used].long()].reshape(-1, cache.shape[2])[:seq_len]


def mla_paged_attention(
    q_nope_absorbed: torch.Tensor,
    q_rope: torch.Tensor,
    latent_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    *,
    scale: float,
    causal: bool = True,
    return_lse: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Reference of :func:`deepinfer_kernels.mla_paged_attention` (see the module docstring)."""
    total_q, heads, rank = q_nope_absorbed.shape
    out = torch.zeros(total_q, heads, rank, dtype=torch.float32, device=q_rope.device)
    lse = torch.full((total_q, heads), float("-inf"), dtype=torch.float32, device=q_rope.device)
    cu = cu_seqlens_q.tolist()
    for b, n in enumerate(seq_lens.tolist()):
        start, end = cu[b], cu[b + 1]
        if end == start:
            continue
        c = gather_latent(latent_cache, block_table[b], n).float()
        c_kv, k_rope = c[:, :rank], c[:, rank:]
        qn, qr = q_nope_absorbed[start:end].float(), q_rope[start:end].float()
        scores = torch.einsum("mhr,nr->hmn", qn, c_kv) + torch.einsum("mhp,np->hmn", qr, k_rope)
        scores = scores * scale
        if causal:
            pos = torch.arange(n - (end - start), n, device=c.device)[:, None]
            keep = torch.arange(n, device=c.device)[None, :] <= pos
            scores = scores.masked_fill(~keep[None], float("-inf"))
        row_lse = torch.logsumexp(scores, dim=-1)
        probs = torch.exp(scores - row_lse[..., None])
        out[start:end] = torch.einsum("hmn,nr->mhr", probs, c_kv)
        lse[start:end] = row_lse.transpose(0, 1)
    result = out.to(q_nope_absorbed.dtype)
    return (result, lse) if return_lse else result


def write_latent_kv(
    kv_latent: torch.Tensor,
    k_rope: torch.Tensor,
    latent_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """For each token ``t`` with ``s = slot_mapping[t] >= 0``:
    ``latent_cache[s // bs, s % bs] = [kv_latent[t] | k_rope[t]]``. Slot -1 is skipped."""
    block_size = latent_cache.shape[1]
    for t in range(kv_latent.shape[0]):
        s = int(slot_mapping[t])
        if s < 0:
            continue
        row = torch.cat([kv_latent[t], k_rope[t]]).to(latent_cache.dtype)
        latent_cache[s // block_size, s % block_size] = row
