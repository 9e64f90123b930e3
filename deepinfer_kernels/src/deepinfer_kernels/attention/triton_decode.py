# mypy: disable-error-code="no-untyped-def,untyped-decorator"
"""Split-K (flash-decoding) paged decode attention and the log-sum-exp merge kernels.

Stage 1, grid ``(batch, num_kv_heads, num_splits)``: the keys a decode query may see,
``[max(0, n - W), n)``, are cut into ``num_splits`` contiguous chunks (multiples of
``BLOCK_N``); each program attends the ``GROUP`` query heads of one KV head to one chunk and
writes a normalised partial output ``o_s`` (fp32) and its ``lse_s`` (``-inf`` for an empty
chunk). Stage 2, grid ``(batch, Hq)``, merges the partials::

    lse = log sum_s exp(lse_s),   o = sum_s exp(lse_s - lse) o_s

With one split, stage 1 writes the final output directly and stage 2 is skipped.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from deepinfer_kernels.attention.triton_common import (
    dot_precision,
    load_kv_tile,
    next_pow2,
    soft_cap_logits,
    upcast_dot,
)
from deepinfer_kernels.launch_configs import decode_split_launch


@triton.jit
def _decode_split_kernel(
    q_ptr, k_ptr, v_ptr, po_ptr, plse_ptr,
    block_table_ptr, seq_lens_ptr,
    scale, soft_cap, window,
    stride_qb, stride_qh,
    stride_kb, stride_ks, stride_kh,
    stride_vb, stride_vs, stride_vh,
    stride_bt, num_blocks, max_blocks,
    NUM_SPLITS: tl.constexpr, NUM_Q_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    GROUP: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr,
    USE_WINDOW: tl.constexpr, USE_CAP: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr,
):  # fmt: skip
    b = tl.program_id(0).to(tl.int64)
    kv_head = tl.program_id(1).to(tl.int64)
    split = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + b)
    k_lo = 0
    if USE_WINDOW:
        k_lo = tl.maximum(seq_len - window, 0)
    chunk = tl.cdiv(tl.cdiv(seq_len - k_lo, NUM_SPLITS), BLOCK_N) * BLOCK_N
    start = k_lo + split * chunk
    end = tl.minimum(start + chunk, seq_len)

    offs_h = tl.arange(0, BLOCK_H)
    h_ok = offs_h < GROUP
    head = kv_head * GROUP + offs_h
    offs_d = tl.arange(0, D_PAD)
    d_ok = offs_d < HEAD_DIM
    q = tl.load(
        q_ptr + b * stride_qb + head[:, None] * stride_qh + offs_d[None, :],
        mask=h_ok[:, None] & d_ok[None, :],
        other=0.0,
    )
    if UPCAST:
        q = q.to(tl.float32)

    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, D_PAD], tl.float32)
    offs_n = tl.arange(0, BLOCK_N)
    bt_row = b * stride_bt
    for start_n in range(start, end, BLOCK_N):
        kpos = start_n + offs_n
        k_ok = kpos < end
        k, readable = load_kv_tile(
            k_ptr, block_table_ptr, bt_row, kpos, k_ok, kv_head, offs_d, d_ok,
            stride_kb, stride_ks, stride_kh, num_blocks, max_blocks, BLOCK_SIZE, True,
        )  # fmt: skip
        if UPCAST:
            k = k.to(tl.float32)
        s = tl.dot(q, k, input_precision=PRECISION)
        if USE_CAP:
            s = soft_cap_logits(s * scale, soft_cap) * 1.4426950408889634
        else:
            s = s * (scale * 1.4426950408889634)
        s = tl.where(readable[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.math.exp2(s - m_safe[:, None])
        alpha = tl.math.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        v, _ = load_kv_tile(
            v_ptr, block_table_ptr, bt_row, kpos, readable, kv_head, offs_d, d_ok,
            stride_vb, stride_vs, stride_vh, num_blocks, max_blocks, BLOCK_SIZE, False,
        )  # fmt: skip
        if UPCAST:
            v = v.to(tl.float32)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m_i = m_new

    has_keys = l_i > 0
    out = acc / tl.where(has_keys, l_i, 1.0)[:, None]
    log_l = tl.math.log2(tl.where(has_keys, l_i, 1.0))
    lse = tl.where(has_keys, (m_i + log_l) * 0.6931471805599453, float("-inf"))
    # Partials are laid out [batch, Hq, NUM_SPLITS, D] / [batch, Hq, NUM_SPLITS].
    row = (b * NUM_Q_HEADS + head) * NUM_SPLITS + split
    tl.store(
        po_ptr + row[:, None] * HEAD_DIM + offs_d[None, :],
        out.to(po_ptr.dtype.element_ty),
        mask=h_ok[:, None] & d_ok[None, :],
    )
    tl.store(plse_ptr + row, lse, mask=h_ok)


@triton.jit
def _merge_splits_kernel(
    po_ptr, plse_ptr, out_ptr, lse_ptr,
    NUM_SPLITS: tl.constexpr, S_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)  # b * Hq + h
    offs_s = tl.arange(0, S_PAD)
    s_ok = offs_s < NUM_SPLITS
    offs_d = tl.arange(0, D_PAD)
    d_ok = offs_d < HEAD_DIM
    lse_s = tl.load(plse_ptr + row * NUM_SPLITS + offs_s, mask=s_ok, other=float("-inf"))
    m = tl.max(lse_s, 0)
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    w = tl.exp(lse_s - m_safe)
    total = tl.sum(w, 0)
    parts = tl.load(
        po_ptr + (row * NUM_SPLITS + offs_s)[:, None] * HEAD_DIM + offs_d[None, :],
        mask=s_ok[:, None] & d_ok[None, :],
        other=0.0,
    )
    inv = tl.where(total > 0, 1.0 / tl.where(total > 0, total, 1.0), 0.0)
    out = tl.sum(parts * w[:, None], 0) * inv
    tl.store(out_ptr + row * HEAD_DIM + offs_d, out.to(out_ptr.dtype.element_ty), mask=d_ok)
    lse = tl.where(total > 0, m_safe + tl.log(tl.where(total > 0, total, 1.0)), float("-inf"))
    tl.store(lse_ptr + row, lse)


@triton.jit
def _merge_states_kernel(
    oa_ptr, la_ptr, ob_ptr, lb_ptr, out_ptr, lse_ptr,
    HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)  # token * H + head, all inputs contiguous
    offs_d = tl.arange(0, D_PAD)
    d_ok = offs_d < HEAD_DIM
    la = tl.load(la_ptr + row)
    lb = tl.load(lb_ptr + row)
    m = tl.maximum(la, lb)
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    wa = tl.exp(la - m_safe)
    wb = tl.exp(lb - m_safe)
    total = wa + wb
    inv = tl.where(total > 0, 1.0 / tl.where(total > 0, total, 1.0), 0.0)
    oa = tl.load(oa_ptr + row * HEAD_DIM + offs_d, mask=d_ok, other=0.0).to(tl.float32)
    ob = tl.load(ob_ptr + row * HEAD_DIM + offs_d, mask=d_ok, other=0.0).to(tl.float32)
    out = (oa * wa + ob * wb) * inv
    tl.store(out_ptr + row * HEAD_DIM + offs_d, out.to(out_ptr.dtype.element_ty), mask=d_ok)
    lse = tl.where(total > 0, m_safe + tl.log(tl.where(total > 0, total, 1.0)), float("-inf"))
    tl.store(lse_ptr + row, lse)


def paged_decode_attention_triton(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    window: int,
    soft_cap: float,
    num_splits: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Launch split-K decode on validated inputs; returns ``(out, lse fp32)``."""
    q = q.contiguous()
    block_table, seq_lens = block_table.contiguous(), seq_lens.contiguous()
    batch, hq, d = q.shape
    _, block_size, hkv, _ = k_cache.shape
    out = torch.empty_like(q)
    lse = torch.empty((batch, hq), dtype=torch.float32, device=q.device)
    if batch == 0:
        return out, lse
    group = hq // hkv
    launch = decode_split_launch(group, d, q.dtype == torch.float32)
    block_h, block_n = launch["BLOCK_H"], launch["BLOCK_N"]
    if num_splits == 1:
        part_out, part_lse = out, lse
    else:
        part_out = torch.empty((batch, hq, num_splits, d), dtype=torch.float32, device=q.device)
        part_lse = torch.empty((batch, hq, num_splits), dtype=torch.float32, device=q.device)
    _decode_split_kernel[(batch, hkv, num_splits)](
        q, k_cache, v_cache, part_out, part_lse,
        block_table, seq_lens,
        scale, soft_cap if soft_cap > 0 else 1.0, max(window, 1),
        q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        block_table.stride(0), k_cache.shape[0], block_table.shape[1],
        NUM_SPLITS=num_splits, NUM_Q_HEADS=hq,
        HEAD_DIM=d, D_PAD=next_pow2(d, 16), BLOCK_SIZE=block_size,
        GROUP=group, BLOCK_H=block_h, BLOCK_N=block_n,
        USE_WINDOW=window > 0, USE_CAP=soft_cap > 0, PRECISION=dot_precision(q.dtype), UPCAST=upcast_dot(q.dtype),
        num_warps=launch.num_warps, num_stages=launch.num_stages,
    )  # fmt: skip
    if num_splits > 1:
        _merge_splits_kernel[(batch * hq,)](
            part_out, part_lse, out, lse,
            NUM_SPLITS=num_splits, S_PAD=next_pow2(num_splits, 2),
            HEAD_DIM=d, D_PAD=next_pow2(d, 16),
        )  # fmt: skip
    return out, lse


def merge_attention_states_triton(
    o_a: torch.Tensor, lse_a: torch.Tensor, o_b: torch.Tensor, lse_b: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Launch the two-state merge on validated inputs; returns ``(o, lse fp32)``."""
    o_a, o_b = o_a.contiguous(), o_b.contiguous()
    lse_a, lse_b = lse_a.contiguous(), lse_b.contiguous()
    tokens, heads, d = o_a.shape
    out = torch.empty_like(o_a)
    lse = torch.empty((tokens, heads), dtype=torch.float32, device=o_a.device)
    if tokens * heads == 0:
        return out, lse
    _merge_states_kernel[(tokens * heads,)](
        o_a, lse_a, o_b, lse_b, out, lse, HEAD_DIM=d, D_PAD=next_pow2(d, 16)
    )
    return out, lse
