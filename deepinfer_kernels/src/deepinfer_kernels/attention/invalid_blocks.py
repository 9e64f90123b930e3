"""What paged attention does with block ids it cannot read, on every path.

With ``check_values=False`` nobody has looked at the block table, so a stale or corrupt entry
must not turn into an out-of-bounds read (garbage, or a segfault on the GPU). The rule every
path follows: a key position whose block column lies past the table's width, or whose block id
is outside ``[0, num_blocks)``, is skipped, exactly as if it were masked. Queries keep their
positions; a query left with no key gets ``o = 0`` and ``lse = -inf`` (the merge identity).

The Triton kernels apply the rule tile by tile (see ``triton_common.load_kv_tile``). The torch
path's planner assumes a clean table, so when one is not clean it runs the dense masked
computation here instead: slow, but only on input that the value checks would have refused.
"""

from __future__ import annotations

import torch


def readable_keys(
    block_table_row: torch.Tensor, seq_len: int, num_blocks: int, block_size: int
) -> torch.Tensor:
    """Boolean ``[seq_len]``: True where key ``j`` sits on a block this table can read."""
    pos = torch.arange(max(seq_len, 0), device=block_table_row.device)
    col = pos // block_size
    in_table = col < block_table_row.shape[0]
    ids = block_table_row.long()[col.clamp(max=max(block_table_row.shape[0] - 1, 0))]
    if block_table_row.shape[0] == 0:
        return torch.zeros_like(pos, dtype=torch.bool)
    return in_table & (ids >= 0) & (ids < num_blocks)


def has_unreadable_blocks(
    block_table: torch.Tensor, seq_lens: list[int], num_blocks: int, block_size: int
) -> bool:
    """Whether any used key position of the batch falls on an unreadable block."""
    max_blocks = block_table.shape[1]
    for b, n in enumerate(seq_lens):
        used = -(-max(n, 0) // block_size)
        if used > max_blocks:
            return True
        row = block_table[b, :used]
        if used and bool(((row < 0) | (row >= num_blocks)).any()):
            return True
    return False


def paged_attention_masked(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: list[int],
    cu_seqlens_q: list[int],
    scale: float,
    causal: bool,
    window: int,
    soft_cap: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Dense attention per sequence with unreadable keys masked; fp32 math, output in q's dtype."""
    num_blocks, block_size, hkv, _ = k_cache.shape
    group = q.shape[1] // hkv
    out = torch.zeros_like(q)
    lse = torch.full(q.shape[:2], float("-inf"), dtype=torch.float32, device=q.device)
    for b, n in enumerate(seq_lens):
        lo, hi = cu_seqlens_q[b], cu_seqlens_q[b + 1]
        if hi <= lo or n <= 0:
            continue
        ok = readable_keys(block_table[b], n, num_blocks, block_size)
        cols = (torch.arange(n, device=q.device) // block_size).clamp(max=block_table.shape[1] - 1)
        ids = torch.where(ok, block_table[b].long()[cols], 0)
        slot = torch.arange(n, device=q.device) % block_size
        k = k_cache[ids, slot].float().repeat_interleave(group, dim=1)
        v = v_cache[ids, slot].float().repeat_interleave(group, dim=1)
        pos = torch.arange(n - (hi - lo), n, device=q.device)[:, None]
        key = torch.arange(n, device=q.device)[None, :]
        keep = ok[None, :].expand(hi - lo, n)
        if causal:
            keep = keep & (key <= pos)
        if window > 0:
            keep = keep & (key > pos - window)
        s = torch.einsum("mhd,nhd->hmn", q[lo:hi].float(), k) * scale
        if soft_cap > 0:
            s = soft_cap * torch.tanh(s / soft_cap)
        s = s.masked_fill(~keep[None], float("-inf"))
        row_lse = torch.logsumexp(s, dim=-1)
        p = torch.exp(s - torch.where(torch.isinf(row_lse), 0.0, row_lse)[..., None])
        out[lo:hi] = torch.einsum("hmn,nhd->mhd", p, v).to(q.dtype)
        lse[lo:hi] = row_lse.transpose(0, 1)
    return out, lse
