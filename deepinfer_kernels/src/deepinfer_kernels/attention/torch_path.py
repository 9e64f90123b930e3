"""Fast torch path of paged attention for CPU (and any non-Triton device).

Same maths as :mod:`deepinfer_kernels.reference.attention`, organised for speed:

* Work is cut into *tiles* (a sequence's queries, or a chunk of a long prefill). All short
  tiles (decode, verification) are padded to a common query length and computed as one
  batch; long tiles run one at a time with their query chunk bounded so the score matrix
  stays within a memory budget.
* Each tile gathers only the pages its queries can see (window start to causal end), with
  one vectorised ``index_select`` per batch, never per token.
* GQA is handled by viewing the query heads as ``[Hkv, group]`` so each KV head is read
  once for its whole group (no ``repeat_interleave`` of K and V).
* Softmax is unnormalised: ``o = (exp(s - m) @ v) / l`` and ``lse = m + log(l)``, so the
  log-sum-exp comes for free.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

# A tile with more queries than this runs alone; shorter ones are batched together.
_SHORT_TILE = 16
# Upper bound on fp32 score elements materialised at once (64 MiB).
_SCORE_BUDGET = 1 << 24


@dataclass(frozen=True)
class _Tile:
    seq: int
    row: int  # first query row in q
    n_q: int
    first_pos: int  # absolute position of the first query
    key_lo: int  # first key position it may read (block-aligned)
    key_hi: int  # one past the last key position it may read


def _make_tiles(
    seq_lens: list[int],
    cu: list[int],
    causal: bool,
    window: int,
    block_size: int,
    group: int,
    num_kv_heads: int,
) -> list[_Tile]:
    tiles = []
    for b, n in enumerate(seq_lens):
        m = cu[b + 1] - cu[b]
        if m == 0:
            continue
        chunk = m
        if m > _SHORT_TILE:
            per_query = max(1, group * num_kv_heads * n)
            chunk = max(_SHORT_TILE, min(m, _SCORE_BUDGET // per_query))
        for s in range(0, m, chunk):
            cnt = min(chunk, m - s)
            p0 = n - m + s
            hi = p0 + cnt if causal else n
            lo = max(0, p0 - window + 1) if window > 0 else 0
            lo -= lo % block_size
            tiles.append(_Tile(b, cu[b] + s, cnt, p0, lo, hi))
    return tiles


# CPU flash-attention kernel that also returns the natural-log LSE in fp32 (fp32 accumulation
# for fp16/bf16 inputs, strided K/V accepted). Absent on some builds: then the manual path runs.
_FUSED = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


def _fused_softmax(
    qt: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    keep: torch.Tensor,
    scale: float,
    group: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``qt [nb, Hkv, G*M, D]``, ``k, v [nb, Hkv, L, D]``, ``keep [nb, M, L]`` ->
    ``(o [nb, Hkv, G*M, D], lse [nb, Hkv, G*M] fp32)``."""
    nb, m, n = keep.shape
    bias = torch.zeros(keep.shape, dtype=qt.dtype, device=qt.device)
    bias.masked_fill_(~keep, float("-inf"))
    bias = bias[:, None].expand(nb, group, m, n).reshape(nb, 1, group * m, n)
    assert _FUSED is not None
    o, lse = _FUSED(qt, k, v, attn_mask=bias, scale=scale)
    return o, lse


def _manual_softmax(
    qt: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    keep: torch.Tensor,
    scale: float,
    soft_cap: float,
    group: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Same contract as :func:`_fused_softmax`, in explicit fp32 ops (soft-cap capable):
    unnormalised ``exp(s - m)``, then ``o = (p @ v) / l`` and ``lse = m + log(l)``."""
    nb, m, n = keep.shape
    hkv, d = k.shape[1], k.shape[3]
    f32 = torch.float32
    kf = k.to(dtype=f32, memory_format=torch.contiguous_format)
    vf = v.to(dtype=f32, memory_format=torch.contiguous_format)
    scores = torch.matmul(qt.float(), kf.transpose(-1, -2)).mul_(scale)
    if soft_cap > 0:
        scores = scores.div_(soft_cap).tanh_().mul_(soft_cap)
    scores = scores.view(nb, hkv, group, m, n)
    scores.masked_fill_(~keep[:, None, None], float("-inf"))
    mx = scores.amax(dim=-1, keepdim=True)
    p = scores.sub_(mx).exp_()
    denom = p.sum(dim=-1, keepdim=True)
    o = torch.matmul(p.view(nb, hkv, group * m, n), vf).view(nb, hkv, group, m, d)
    o = o / denom
    row_lse = (mx + torch.log(denom)).view(nb, hkv, group * m)
    return o.view(nb, hkv, group * m, d).to(qt.dtype), row_lse


def _attend_tiles(
    tiles: list[_Tile],
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: list[int],
    out: torch.Tensor,
    lse: torch.Tensor,
    scale: float,
    causal: bool,
    window: int,
    soft_cap: float,
) -> None:
    """Compute a batch of tiles padded to a common query count and key span."""
    device = q.device
    nb = len(tiles)
    _, block_size, hkv, d = k_cache.shape
    hq = q.shape[1]
    group = hq // hkv
    max_q = max(t.n_q for t in tiles)
    span = max(t.key_hi - t.key_lo for t in tiles)
    n_blk = (span + block_size - 1) // block_size
    max_blocks = block_table.shape[1]

    seq_idx = torch.tensor([t.seq for t in tiles], device=device)
    key_lo = torch.tensor([t.key_lo for t in tiles], device=device)
    lens = torch.tensor([seq_lens[t.seq] for t in tiles], device=device)
    first_pos = torch.tensor([t.first_pos for t in tiles], device=device)
    rows0 = torch.tensor([t.row for t in tiles], device=device)
    n_q = torch.tensor([t.n_q for t in tiles], device=device)

    # Pages each tile reads; columns past the sequence's last block point at block 0 and
    # are masked out below (the table may hold garbage there).
    col = key_lo[:, None] // block_size + torch.arange(n_blk, device=device)[None, :]
    used = (lens + block_size - 1) // block_size
    col_ok = col < used[:, None]
    bt_rows = block_table[seq_idx]
    blocks = torch.gather(bt_rows, 1, col.clamp(max=max_blocks - 1))
    blocks = torch.where(col_ok, blocks, torch.zeros_like(blocks)).reshape(-1).long()
    # [nb, Hkv, L, D] views of the gathered pages (no transpose copy).
    k = k_cache.index_select(0, blocks).view(nb, n_blk * block_size, hkv, d).transpose(1, 2)
    v = v_cache.index_select(0, blocks).view(nb, n_blk * block_size, hkv, d).transpose(1, 2)

    # Queries padded to max_q; padded rows repeat a valid row and are never written back.
    t_idx = torch.arange(max_q, device=device)
    q_ok = t_idx[None, :] < n_q[:, None]
    rows = rows0[:, None] + torch.minimum(t_idx[None, :], n_q[:, None] - 1)
    qt = q.index_select(0, rows.reshape(-1))
    # [nb, max_q, Hkv, G, D] -> [nb, Hkv, G * max_q, D]: the G heads of a KV head share it.
    qt = qt.view(nb, max_q, hkv, group, d).permute(0, 2, 3, 1, 4).reshape(nb, hkv, -1, d)

    key_pos = key_lo[:, None] + torch.arange(n_blk * block_size, device=device)[None, :]
    q_pos = first_pos[:, None] + t_idx[None, :]
    keep = (key_pos < lens[:, None])[:, None, :]
    if causal:
        keep = keep & (key_pos[:, None, :] <= q_pos[:, :, None])
    if window > 0:
        keep = keep & (key_pos[:, None, :] > q_pos[:, :, None] - window)
    keep = keep.expand(nb, max_q, key_pos.shape[1])  # every row keeps at least its own key

    if soft_cap <= 0 and _FUSED is not None:
        o, row_lse = _fused_softmax(qt, k, v, keep, scale, group)
    else:
        o, row_lse = _manual_softmax(qt, k, v, keep, scale, soft_cap, group)

    # [nb, Hkv, G, max_q, ...] back to [nb, max_q, Hq, ...]; scatter the valid rows.
    o = o.view(nb, hkv, group, max_q, d).permute(0, 3, 1, 2, 4).reshape(nb, max_q, hq, d)
    row_lse = row_lse.view(nb, hkv, group, max_q).permute(0, 3, 1, 2).reshape(nb, max_q, hq)
    if bool(q_ok.all()):
        flat_rows = rows.reshape(-1)
        out.index_copy_(0, flat_rows, o.reshape(-1, hq, d).to(out.dtype))
        lse.index_copy_(0, flat_rows, row_lse.reshape(-1, hq))
    else:
        sel = q_ok.reshape(-1)
        flat_rows = rows.reshape(-1)[sel]
        out.index_copy_(0, flat_rows, o.reshape(-1, hq, d)[sel].to(out.dtype))
        lse.index_copy_(0, flat_rows, row_lse.reshape(-1, hq)[sel])


def paged_attention_torch(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    scale: float,
    causal: bool,
    window: int,
    soft_cap: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Paged attention for validated inputs; ``window <= 0`` / ``soft_cap <= 0`` mean off.

    Returns ``(out like q, lse [total_q, Hq] fp32)``.
    """
    out = torch.empty_like(q)
    lse = torch.empty(q.shape[:2], dtype=torch.float32, device=q.device)
    if q.shape[0] == 0:
        return out, lse
    lens = seq_lens.tolist()
    cu = cu_seqlens_q.tolist()
    block_size, hkv = k_cache.shape[1], k_cache.shape[2]
    tiles = _make_tiles(lens, cu, causal, window, block_size, q.shape[1] // hkv, hkv)
    short = [t for t in tiles if t.n_q <= _SHORT_TILE]
    long = [t for t in tiles if t.n_q > _SHORT_TILE]
    args = (q, k_cache, v_cache, block_table, lens, out, lse, scale, causal, window, soft_cap)
    # Short tiles share one batch as long as the padded scores fit the budget.
    per_tile = q.shape[1] * _SHORT_TILE * 1
    batch: list[_Tile] = []
    batch_span = 0
    for t in short:
        span = max(batch_span, t.key_hi - t.key_lo)
        if batch and (len(batch) + 1) * span * per_tile > _SCORE_BUDGET:
            _attend_tiles(batch, *args)
            batch, span = [], t.key_hi - t.key_lo
        batch.append(t)
        batch_span = span
    if batch:
        _attend_tiles(batch, *args)
    for t in long:
        _attend_tiles([t], *args)
    return out, lse


def default_scale(head_dim: int, scale: float | None) -> float:
    return 1.0 / math.sqrt(head_dim) if scale is None else scale
