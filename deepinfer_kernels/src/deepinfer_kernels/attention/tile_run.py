"""The *run* half of the torch path of paged attention (see ``torch_path.py``): per layer,
one ``index_select`` (or slice) of the pages per planned tile batch, the attention itself
(the compiled CPU tile kernel, the CPU flash kernel, or explicit fp32 ops with a soft cap) and
the write-back of the valid rows.
"""

from __future__ import annotations

import torch

from deepinfer_kernels.attention.cpu_flash import CPU_FLASH_ATTENTION as _FUSED
from deepinfer_kernels.attention.tile_plan import TileBatch
from deepinfer_kernels.cpu.attention import PagedAttentionTiles


def _manual_softmax(
    qt: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    keep: torch.Tensor | None,
    scale: float,
    soft_cap: float,
    group: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``qt [nb, Hkv, G*M, D]``, ``k, v [nb, Hkv, L, D]``, ``keep [nb, M, L]`` (``None`` = all)
    -> ``(o [nb, Hkv, G*M, D], lse [nb, Hkv, G*M] fp32)`` in explicit fp32 ops (soft-cap
    capable): unnormalised ``p = exp(s - m)``, then ``o = (p @ v) / l`` and ``lse = m + log(l)``
    with ``l = sum(p)``."""
    nb, hkv, gm, d = qt.shape
    m, n = gm // group, k.shape[2]
    f32 = torch.float32
    kf = k.to(dtype=f32, memory_format=torch.contiguous_format)
    vf = v.to(dtype=f32, memory_format=torch.contiguous_format)
    scores = torch.matmul(qt.float(), kf.transpose(-1, -2)).mul_(scale)
    if soft_cap > 0:
        scores = scores.div_(soft_cap).tanh_().mul_(soft_cap)
    scores = scores.view(nb, hkv, group, m, n)
    if keep is not None:
        scores.masked_fill_(~keep[:, None, None], float("-inf"))
    mx = scores.amax(dim=-1, keepdim=True)
    p = scores.sub_(mx).exp_()
    denom = p.sum(dim=-1, keepdim=True)
    o = torch.matmul(p.view(nb, hkv, group * m, n), vf).view(nb, hkv, group, m, d)
    o = o / denom
    row_lse = (mx + torch.log(denom)).view(nb, hkv, group * m)
    return o.view(nb, hkv, group * m, d).to(qt.dtype), row_lse


def _attend(
    tb: TileBatch,
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    scale: float,
    soft_cap: float,
    want_lse: bool,
    cpu_kernel: PagedAttentionTiles | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One tile batch -> ``(o [num_rows, Hq, D], lse [num_rows, Hq] or None)`` over the padded
    rows."""
    nb, max_q = tb.num_tiles, tb.max_q
    if (
        cpu_kernel is not None
        and cpu_kernel.applies(q, k_cache, v_cache, max_q)
        and cpu_kernel.available()
    ):
        return cpu_kernel.run(
            q,
            k_cache,
            v_cache,
            page_ids=tb.page_ids,
            q_rows=tb.q_rows,
            row_start=tb.row_start or 0,
            keep=tb.keep,
            num_tiles=nb,
            max_q=max_q,
            num_pages=tb.num_pages,
            key_len=tb.key_len,
            scale=scale,
            soft_cap=soft_cap,
            want_lse=want_lse,
        )
    _, block_size, hkv, d = k_cache.shape
    hq = q.shape[1]
    group = hq // hkv
    keys = tb.num_pages * block_size
    # [nb, Hkv, L, D] views of the gathered pages (no transpose copy).
    if tb.page_start is not None:
        # A slice of the pool; a view when the cache is dense in its block dims (a pool slab is).
        end = tb.page_start + nb * tb.num_pages
        k = k_cache[tb.page_start : end].reshape(nb, keys, hkv, d)
        v = v_cache[tb.page_start : end].reshape(nb, keys, hkv, d)
    else:
        k = k_cache.index_select(0, tb.page_ids).view(nb, keys, hkv, d)
        v = v_cache.index_select(0, tb.page_ids).view(nb, keys, hkv, d)
    if tb.key_len < keys:
        k, v = k[:, : tb.key_len], v[:, : tb.key_len]
    k, v = k.transpose(1, 2), v.transpose(1, 2)
    if tb.row_start is not None:
        qs = q[tb.row_start : tb.row_start + tb.num_rows]
    else:
        assert tb.q_rows is not None
        qs = q.index_select(0, tb.q_rows)
    if tb.causal_from is not None and soft_cap <= 0 and _FUSED is not None:
        return _attend_causal(tb.causal_from, qs, k, v, scale, want_lse)
    # [nb, max_q, Hkv, G, D] -> [nb, Hkv, G * max_q, D]: the G heads of a KV head share it.
    qt = qs.view(nb, max_q, hkv, group, d).permute(0, 2, 3, 1, 4).reshape(nb, hkv, -1, d)
    if soft_cap <= 0 and _FUSED is not None:
        o, row_lse = _FUSED(qt, k, v, attn_mask=tb.bias, scale=scale)
    else:
        o, row_lse = _manual_softmax(qt, k, v, tb.keep, scale, soft_cap, group)
    # [nb, Hkv, G, max_q, ...] back to [nb * max_q, Hq, ...].
    o = o.view(nb, hkv, group, max_q, d).permute(0, 3, 1, 2, 4).reshape(nb * max_q, hq, d)
    if not want_lse:
        return o, None
    row_lse = row_lse.view(nb, hkv, group, max_q).permute(0, 3, 1, 2).reshape(nb * max_q, hq)
    return o, row_lse


def _attend_causal(
    start: int,
    qs: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float,
    want_lse: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A lone tile whose row ``r`` keeps keys ``j <= start + r`` (see ``TileBatch``):
    ``qs [M, Hq, D]``, ``k, v [1, Hkv, start + M, D]``.

    The flash kernel's causal mode is top-left aligned, so the tile's own ``M`` keys run in it
    and the ``start`` keys before them (all kept) in a second, unmasked call; the two softmaxes
    merge exactly through their log-sum-exps. Its causal mode needs one KV head per query head:
    K and V are expanded (a copy of the tile's keys, small next to the scores it skips).
    """
    assert _FUSED is not None
    group = qs.shape[1] // k.shape[1]
    q4 = qs.transpose(0, 1)[None]  # [1, Hq, M, D]
    k4, v4 = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    o, lse = _FUSED(q4, k4[:, :, start:], v4[:, :, start:], is_causal=True, scale=scale)
    if start:
        o_pre, lse_pre = _FUSED(q4, k4[:, :, :start], v4[:, :, :start], scale=scale)
        top = torch.maximum(lse, lse_pre)
        w, w_pre = torch.exp(lse - top)[..., None], torch.exp(lse_pre - top)[..., None]
        o = (o.float() * w + o_pre.float() * w_pre) / (w + w_pre)
        lse = top + torch.log(w + w_pre)[..., 0]
    out = o[0].transpose(0, 1).to(qs.dtype)  # [M, Hq, D]
    return out, (lse[0].transpose(0, 1) if want_lse else None)


def run_tile_batches(
    batches: list[TileBatch],
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    scale: float,
    soft_cap: float,
    want_lse: bool,
    cpu_kernel: PagedAttentionTiles | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Run planned tile batches over one layer's cache; ``soft_cap <= 0`` means off.
    ``cpu_kernel`` runs the short tiles when it applies (see :mod:`deepinfer_kernels.cpu`).

    Returns ``(out like q, lse [total_q, Hq] fp32 or None when not wanted)``.
    """
    total = q.shape[0]
    if len(batches) == 1 and batches[0].row_start == 0 and batches[0].num_rows == total:
        # One batch covering every row in order (a decode batch, a lone prefill): its output
        # is the answer, no scatter.
        o, lse = _attend(batches[0], q, k_cache, v_cache, scale, soft_cap, want_lse, cpu_kernel)
        return o.to(q.dtype), lse
    covered = sum(tb.num_rows if tb.valid is None else tb.valid.numel() for tb in batches)
    if covered < total:
        # Rows of key-less sequences belong to no tile: they answer o = 0, lse = -inf.
        out = torch.zeros_like(q)
        lse_out = torch.full(q.shape[:2], float("-inf"), device=q.device) if want_lse else None
    else:
        out = torch.empty_like(q)
        lse_out = (
            torch.empty(q.shape[:2], dtype=torch.float32, device=q.device) if want_lse else None
        )
    for tb in batches:
        o, lse = _attend(tb, q, k_cache, v_cache, scale, soft_cap, want_lse, cpu_kernel)
        o = o.to(out.dtype)
        if tb.row_start is not None:
            out[tb.row_start : tb.row_start + tb.num_rows] = o
            if lse_out is not None and lse is not None:
                lse_out[tb.row_start : tb.row_start + tb.num_rows] = lse
            continue
        assert tb.out_rows is not None
        if tb.valid is not None:
            o = o.index_select(0, tb.valid)
            lse = None if lse is None else lse.index_select(0, tb.valid)
        out.index_copy_(0, tb.out_rows, o)
        if lse_out is not None and lse is not None:
            lse_out.index_copy_(0, tb.out_rows, lse)
    return out, lse_out
