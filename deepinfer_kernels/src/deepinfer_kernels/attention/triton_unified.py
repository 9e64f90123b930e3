# mypy: disable-error-code="no-untyped-def,untyped-decorator"
"""Unified paged-attention Triton kernel: decode, verification, extend and chunked prefill in
one launch over a ragged batch.

Grid ``(total_q // BLOCK_Q + batch, num_kv_heads)``. Sequence ``b`` owns program ids starting
at ``cu_seqlens_q[b] // BLOCK_Q + b``, which needs no host sync and always leaves room for
``ceil(q_len / BLOCK_Q)`` tiles; a program finds its sequence by binary search over those
starts and exits if its tile is past the sequence's queries. Each program handles
``BLOCK_Q`` query tokens times the ``GROUP`` query heads that share one KV head (GQA rows are
stacked into the M dimension, so each KV tile is loaded once per group), and runs the
online-softmax recurrence over the key tiles it may see::

    m' = max(m, rowmax(s));  l' = l * 2^(m - m') + sum 2^(s - m');  acc' = acc * 2^(m - m') + 2^(s - m') v

in base 2 with ``s`` pre-multiplied by ``log2(e)``; ``lse = ln2 * (m + log2 l)`` at the end.
Only key tiles inside ``[window start, causal end)`` of the program's queries are visited.
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
from deepinfer_kernels.launch_configs import unified_launch


@triton.jit
def _find_sequence(cu_q_ptr, pid, batch, BLOCK_Q: tl.constexpr):
    """Largest ``b`` in ``[0, batch)`` with ``cu_q[b] // BLOCK_Q + b <= pid``."""
    lo = pid * 0
    hi = lo + batch - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        start = tl.load(cu_q_ptr + mid) // BLOCK_Q + mid
        go = start <= pid
        lo = tl.where(go, mid, lo)
        hi = tl.where(go, hi, mid - 1)
    return lo


@triton.jit
def _unified_attention_kernel(
    q_ptr, k_ptr, v_ptr, out_ptr, lse_ptr,
    block_table_ptr, seq_lens_ptr, cu_q_ptr,
    scale, soft_cap, window, batch,
    stride_qt, stride_qh,
    stride_kb, stride_ks, stride_kh,
    stride_vb, stride_vs, stride_vh,
    stride_ot, stride_oh, stride_lt,
    stride_bt, num_blocks, max_blocks,
    HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    GROUP: tl.constexpr, G_PAD: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr, USE_WINDOW: tl.constexpr, USE_CAP: tl.constexpr,
    PRECISION: tl.constexpr, UPCAST: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    kv_head = tl.program_id(1).to(tl.int64)
    b = _find_sequence(cu_q_ptr, pid, batch, BLOCK_Q)
    q_start = tl.load(cu_q_ptr + b)
    q_len = tl.load(cu_q_ptr + b + 1) - q_start
    q0 = (pid - (q_start // BLOCK_Q + b)) * BLOCK_Q
    if q0 >= q_len:
        return
    seq_len = tl.load(seq_lens_ptr + b)
    context = seq_len - q_len  # absolute position of the sequence's first query

    BLOCK_M: tl.constexpr = BLOCK_Q * G_PAD
    offs_m = tl.arange(0, BLOCK_M)
    tok = q0 + offs_m // G_PAD
    grp = offs_m % G_PAD
    row_ok = (tok < q_len) & (grp < GROUP)
    head = kv_head * GROUP + grp
    offs_d = tl.arange(0, D_PAD)
    d_ok = offs_d < HEAD_DIM
    q_row = (q_start + tok).to(tl.int64) * stride_qt + head * stride_qh
    q = tl.load(
        q_ptr + q_row[:, None] + offs_d[None, :],
        mask=row_ok[:, None] & d_ok[None, :],
        other=0.0,
    )
    if UPCAST:
        q = q.to(tl.float32)
    pos = context + tok

    if CAUSAL:
        k_hi = context + tl.minimum(q0 + BLOCK_Q, q_len)
    else:
        k_hi = seq_len
    k_lo = 0
    if USE_WINDOW:
        k_lo = tl.maximum(context + q0 - window + 1, 0)
        k_lo = (k_lo // BLOCK_N) * BLOCK_N

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D_PAD], tl.float32)
    offs_n = tl.arange(0, BLOCK_N)
    bt_row = b.to(tl.int64) * stride_bt
    for start_n in range(k_lo, k_hi, BLOCK_N):
        kpos = start_n + offs_n
        k_ok = kpos < k_hi
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
        keep = readable[None, :] & row_ok[:, None]
        if CAUSAL:
            keep = keep & (kpos[None, :] <= pos[:, None])
        if USE_WINDOW:
            keep = keep & (kpos[None, :] > pos[:, None] - window)
        s = tl.where(keep, s, float("-inf"))
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
    o_row = (q_start + tok).to(tl.int64) * stride_ot + head * stride_oh
    tl.store(
        out_ptr + o_row[:, None] + offs_d[None, :],
        out.to(out_ptr.dtype.element_ty),
        mask=row_ok[:, None] & d_ok[None, :],
    )
    log_l = tl.math.log2(tl.where(has_keys, l_i, 1.0))
    lse = tl.where(has_keys, (m_i + log_l) * 0.6931471805599453, float("-inf"))
    lse_row = (q_start + tok).to(tl.int64) * stride_lt + head
    tl.store(lse_ptr + lse_row, lse, mask=row_ok)


def paged_attention_triton(
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
    """Launch the unified kernel on validated inputs; returns ``(out, lse fp32)``."""
    # The kernel assumes unit strides on the last dims of q and the index tensors.
    q = q.contiguous()
    block_table, seq_lens = block_table.contiguous(), seq_lens.contiguous()
    cu_seqlens_q = cu_seqlens_q.contiguous()
    total_q, hq, d = q.shape
    _, block_size, hkv, _ = k_cache.shape
    batch = block_table.shape[0]
    out = torch.empty_like(q)
    lse = torch.empty((total_q, hq), dtype=torch.float32, device=q.device)
    if total_q == 0 or batch == 0:
        return out, lse
    group = hq // hkv
    launch = unified_launch(total_q, batch, group, d, q.dtype == torch.float32)
    g_pad, block_q, block_n = launch["G_PAD"], launch["BLOCK_Q"], launch["BLOCK_N"]
    grid = (total_q // block_q + batch, hkv)
    _unified_attention_kernel[grid](
        q, k_cache, v_cache, out, lse,
        block_table, seq_lens, cu_seqlens_q,
        scale, soft_cap if soft_cap > 0 else 1.0, max(window, 1), batch,
        q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        out.stride(0), out.stride(1), lse.stride(0),
        block_table.stride(0), k_cache.shape[0], block_table.shape[1],
        HEAD_DIM=d, D_PAD=next_pow2(d, 16), BLOCK_SIZE=block_size,
        GROUP=group, G_PAD=g_pad, BLOCK_Q=block_q, BLOCK_N=block_n,
        CAUSAL=causal, USE_WINDOW=window > 0, USE_CAP=soft_cap > 0,
        PRECISION=dot_precision(q.dtype), UPCAST=upcast_dot(q.dtype),
        num_warps=launch.num_warps, num_stages=launch.num_stages,
    )  # fmt: skip
    return out, lse


__all__ = ["paged_attention_triton"]
