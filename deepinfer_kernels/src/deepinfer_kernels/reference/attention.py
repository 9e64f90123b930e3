"""Reference paged attention: the specification the Triton kernels and the torch path meet.

For sequence ``b`` with ``n = seq_lens[b]`` KV positions and ``m = q_len[b]`` queries, query
``i`` sits at absolute position ``p = n - m + i``. With ``scale`` (default ``head_dim**-0.5``)
and query head ``h`` reading KV head ``h // (Hq // Hkv)``::

    s_j   = scale * <q_i, k_j>
    s_j   = cap * tanh(s_j / cap)                      (if soft_cap)
    keep j iff  j < n,  j <= p (if causal),  j > p - W (if sliding_window=W)
    lse_i = log(sum_{kept j} exp(s_j))                 (natural log, fp32)
    o_i   = sum_{kept j} exp(s_j - lse_i) * v_j

Everything is computed in fp32 and the output is cast to the dtype of ``q``. The code loops
over sequences on purpose: it is meant to be read, not to be fast.
"""

from __future__ import annotations

import math

import torch


def gather_sequence_kv(
    cache: torch.Tensor, block_table_row: torch.Tensor, seq_len: int
) -> torch.Tensor:
    """The first ``seq_len`` positions of one sequence as ``[seq_len, Hkv, D]``."""
    block_size = cache.shape[1]
    num_used = (seq_len + block_size - 1) // block_size
    blocks = cache[block_table_row[:num_used].long()]
    return blocks.reshape(-1, cache.shape[2], cache.shape[3])[:seq_len]


def attention_mask(
    q_len: int, seq_len: int, *, causal: bool, sliding_window: int | None, device: torch.device
) -> torch.Tensor:
    """Boolean ``[q_len, seq_len]`` mask: True where query ``i`` may read key ``j``."""
    pos = torch.arange(seq_len - q_len, seq_len, device=device)[:, None]
    key = torch.arange(seq_len, device=device)[None, :]
    keep = torch.ones(q_len, seq_len, dtype=torch.bool, device=device)
    if causal:
        keep &= key <= pos
    if sliding_window is not None:
        keep &= key > pos - sliding_window
    return keep


def attend_dense(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor,
    *,
    scale: float,
    soft_cap: float | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Masked softmax attention of ``q [m, Hq, D]`` over ``k, v [n, Hkv, D]``, fp32 math.

    Returns ``(out [m, Hq, D] in fp32, lse [m, Hq] in fp32)``.
    """
    group = q.shape[1] // k.shape[1]
    kf = k.float().repeat_interleave(group, dim=1)
    vf = v.float().repeat_interleave(group, dim=1)
    scores = torch.einsum("mhd,nhd->hmn", q.float(), kf) * scale
    if soft_cap is not None:
        scores = soft_cap * torch.tanh(scores / soft_cap)
    scores = scores.masked_fill(~mask[None], float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    probs = torch.exp(scores - lse[..., None])
    out = torch.einsum("hmn,nhd->mhd", probs, vf)
    return out, lse.transpose(0, 1)


def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    *,
    scale: float | None = None,
    causal: bool = True,
    sliding_window: int | None = None,
    soft_cap: float | None = None,
    return_lse: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Reference of :func:`deepinfer_kernels.paged_attention` (see the module docstring)."""
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    out = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    lse = torch.full(q.shape[:2], float("-inf"), dtype=torch.float32, device=q.device)
    cu = cu_seqlens_q.tolist()
    for b, seq_len in enumerate(seq_lens.tolist()):
        start, end = cu[b], cu[b + 1]
        if end == start:
            continue
        k = gather_sequence_kv(k_cache, block_table[b], seq_len)
        v = gather_sequence_kv(v_cache, block_table[b], seq_len)
        mask = attention_mask(
            end - start, seq_len, causal=causal, sliding_window=sliding_window, device=q.device
        )
        out[start:end], lse[start:end] = attend_dense(
            q[start:end], k, v, mask, scale=scale, soft_cap=soft_cap
        )
    result = out.to(q.dtype)
    return (result, lse) if return_lse else result


def paged_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    *,
    scale: float | None = None,
    sliding_window: int | None = None,
    soft_cap: float | None = None,
    return_lse: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Reference of :func:`deepinfer_kernels.paged_decode_attention`: one query per sequence,
    at the last position, so causal masking is implied."""
    cu = torch.arange(q.shape[0] + 1, dtype=torch.int32, device=q.device)
    return paged_attention(
        q,
        k_cache,
        v_cache,
        block_table,
        seq_lens,
        cu,
        scale=scale,
        causal=True,
        sliding_window=sliding_window,
        soft_cap=soft_cap,
        return_lse=return_lse,
    )


def merge_attention_states(
    o_a: torch.Tensor, lse_a: torch.Tensor, o_b: torch.Tensor, lse_b: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Combine attention over two disjoint key sets A and B into attention over A u B::

        lse = log(exp(lse_a) + exp(lse_b))
        o   = exp(lse_a - lse) * o_a + exp(lse_b - lse) * o_b

    A side with ``lse = -inf`` (no keys) contributes nothing; if both are empty the output
    is 0 and ``lse`` is ``-inf``. Math in fp32, output in the dtype of ``o_a``.
    """
    la, lb = lse_a.float(), lse_b.float()
    lse = torch.logaddexp(la, lb)
    finite = torch.isfinite(lse)
    safe = torch.where(finite, lse, torch.zeros_like(lse))
    wa = torch.where(finite, torch.exp(la - safe), torch.zeros_like(la))
    wb = torch.where(finite, torch.exp(lb - safe), torch.zeros_like(lb))
    out = wa[..., None] * o_a.float() + wb[..., None] * o_b.float()
    return out.to(o_a.dtype), lse
