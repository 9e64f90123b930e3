# mypy: disable-error-code="no-untyped-def,untyped-decorator"
"""Triton MLA attention over the paged latent cache, split-K with a log-sum-exp merge.

Stage 1, grid ``(total_q, cdiv(H, BLOCK_H), num_splits)``: a program takes ``BLOCK_H`` heads
of one query row and one contiguous chunk of the keys that row may read; each latent tile is
loaded once and used as key (``c_kv`` and ``k_rope`` parts) and value (``c_kv`` part) by every
head of the program. It writes a normalised partial output (fp32) and its ``lse`` (``-inf``
for an empty chunk). Stage 2 (torch) merges the partials::

    lse = log sum_s exp(lse_s),   o = sum_s exp(lse_s - lse) o_s

Splitting the keys is what keeps a GPU busy on long decodes with few query rows (FlashMLA's
reason for its split-KV scheduler); a verify or extend row is one more program row.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from deepinfer_kernels._dispatch import interpreter_active
from deepinfer_kernels.launch_configs import mla_launch

# Enough programs to fill an H200-class GPU (132 SMs) about twice over.
_TARGET_PROGRAMS = 264
_MIN_KEYS_PER_SPLIT = 256
_MAX_SPLITS = 64


@triton.jit
def _mla_split_kernel(
    qn_ptr, qr_ptr, cache_ptr, bt_ptr, seq_lens_ptr, cu_ptr, row_seq_ptr,
    po_ptr, plse_ptr,
    scale, num_blocks, max_blocks, total_q,
    stride_qn_t, stride_qn_h, stride_qr_t, stride_qr_h,
    stride_cb, stride_cs, stride_bt,
    NUM_HEADS: tl.constexpr, RANK: tl.constexpr, R_PAD: tl.constexpr,
    ROPE: tl.constexpr, P_PAD: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, NUM_SPLITS: tl.constexpr,
    CAUSAL: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    head0 = tl.program_id(1) * BLOCK_H
    split = tl.program_id(2)
    b = tl.load(row_seq_ptr + row).to(tl.int64)
    seq_len = tl.load(seq_lens_ptr + b)
    q_start = tl.load(cu_ptr + b)
    q_len = tl.load(cu_ptr + b + 1) - q_start
    k_hi = seq_len
    if CAUSAL:
        k_hi = seq_len - q_len + (row - q_start).to(tl.int32) + 1
    chunk = tl.cdiv(tl.cdiv(k_hi, NUM_SPLITS), BLOCK_N) * BLOCK_N
    start = split * chunk
    end = tl.minimum(start + chunk, k_hi)

    offs_h = head0 + tl.arange(0, BLOCK_H)
    h_ok = offs_h < NUM_HEADS
    offs_r = tl.arange(0, R_PAD)
    r_ok = offs_r < RANK
    offs_p = tl.arange(0, P_PAD)
    p_ok = offs_p < ROPE
    qn = tl.load(
        qn_ptr + row * stride_qn_t + offs_h[:, None] * stride_qn_h + offs_r[None, :],
        mask=h_ok[:, None] & r_ok[None, :], other=0.0,
    )  # fmt: skip
    qr = tl.load(
        qr_ptr + row * stride_qr_t + offs_h[:, None] * stride_qr_h + offs_p[None, :],
        mask=h_ok[:, None] & p_ok[None, :], other=0.0,
    )  # fmt: skip
    if UPCAST:
        qn, qr = qn.to(tl.float32), qr.to(tl.float32)

    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, R_PAD], tl.float32)
    offs_n = tl.arange(0, BLOCK_N)
    for start_n in range(start, end, BLOCK_N):
        kpos = start_n + offs_n
        k_ok = kpos < end
        col = kpos // BLOCK_SIZE
        col_ok = k_ok & (col < max_blocks)
        phys = tl.load(bt_ptr + b * stride_bt + col, mask=col_ok, other=-1).to(tl.int64)
        # A corrupt table (value checks off) never reads outside the pool.
        readable = col_ok & (phys >= 0) & (phys < num_blocks)
        base = cache_ptr + phys * stride_cb + (kpos % BLOCK_SIZE).to(tl.int64) * stride_cs
        c_kv = tl.load(base[:, None] + offs_r[None, :], mask=readable[:, None] & r_ok[None, :],
                       other=0.0)  # fmt: skip
        k_pe = tl.load(base[None, :] + RANK + offs_p[:, None],
                       mask=readable[None, :] & p_ok[:, None], other=0.0)  # fmt: skip
        if UPCAST:
            c_kv, k_pe = c_kv.to(tl.float32), k_pe.to(tl.float32)
        s = tl.dot(qn, tl.trans(c_kv), input_precision=PRECISION)
        s = tl.dot(qr, k_pe, s, input_precision=PRECISION)
        s = s * scale
        s = tl.where(readable[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp(m_i - m_safe)
        p = tl.exp(s - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        acc = tl.dot(p.to(c_kv.dtype), c_kv, acc, input_precision=PRECISION)
        m_i = m_new
    has = l_i > 0
    o = acc / tl.where(has, l_i, 1.0)[:, None]
    lse = tl.where(has, m_i + tl.log(tl.where(has, l_i, 1.0)), float("-inf"))
    out_row = (split * total_q + row) * NUM_HEADS + offs_h
    tl.store(
        po_ptr + out_row[:, None] * RANK + offs_r[None, :], o,
        mask=h_ok[:, None] & r_ok[None, :],
    )  # fmt: skip
    tl.store(plse_ptr + out_row, lse, mask=h_ok)


def choose_mla_splits(total_q: int, num_heads: int, block_h: int, max_kv_len: int) -> int:
    """Split-K factor from static sizes only (no host sync): enough programs to fill the GPU,
    at least 256 keys per split, at most 64 splits."""
    programs = max(1, total_q * triton.cdiv(num_heads, block_h))
    want = triton.cdiv(_TARGET_PROGRAMS, programs)
    by_len = max(1, max_kv_len // _MIN_KEYS_PER_SPLIT)
    return int(max(1, min(want, by_len, _MAX_SPLITS)))


def merge_splits(po: torch.Tensor, plse: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``po [S, T, H, R]``, ``plse [S, T, H]`` -> ``(o [T, H, R] fp32, lse [T, H])``."""
    lse = torch.logsumexp(plse, dim=0)
    safe = torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))
    w = torch.where(torch.isfinite(plse), torch.exp(plse - safe), torch.zeros_like(plse))
    return (w[..., None] * po).sum(0), lse


def mla_attention_triton(
    q_nope: torch.Tensor,
    q_rope: torch.Tensor,
    latent_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    scale: float,
    causal: bool,
    num_splits: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    total_q, heads, rank = q_nope.shape
    rope = q_rope.shape[2]
    device = q_nope.device
    interp = interpreter_active()
    launch = mla_launch(q_nope.dtype == torch.float32)
    block_h, block_n = launch["BLOCK_H"], launch["BLOCK_N"]
    if num_splits <= 0:
        span = block_table.shape[1] * latent_cache.shape[1]
        num_splits = choose_mla_splits(total_q, heads, block_h, span)
    po = torch.empty(num_splits, total_q, heads, rank, dtype=torch.float32, device=device)
    plse = torch.empty(num_splits, total_q, heads, dtype=torch.float32, device=device)
    if total_q == 0:
        return torch.empty_like(q_nope), plse[0]
    rows = torch.arange(total_q, device=device, dtype=torch.int32)
    row_seq = torch.searchsorted(cu_seqlens_q[1:], rows, right=True).to(torch.int32)
    q_nope = q_nope if q_nope.stride(-1) == 1 else q_nope.contiguous()
    q_rope = q_rope if q_rope.stride(-1) == 1 else q_rope.contiguous()
    block_table = block_table.contiguous()
    grid = (total_q, triton.cdiv(heads, block_h), num_splits)
    _mla_split_kernel[grid](
        q_nope, q_rope, latent_cache, block_table, seq_lens, cu_seqlens_q, row_seq, po, plse,
        scale, latent_cache.shape[0], block_table.shape[1], total_q,
        q_nope.stride(0), q_nope.stride(1), q_rope.stride(0), q_rope.stride(1),
        latent_cache.stride(0), latent_cache.stride(1), block_table.stride(0),
        NUM_HEADS=heads, RANK=rank, R_PAD=max(16, triton.next_power_of_2(rank)),
        ROPE=rope, P_PAD=max(16, triton.next_power_of_2(rope)),
        BLOCK_SIZE=latent_cache.shape[1], BLOCK_H=block_h, BLOCK_N=block_n,
        NUM_SPLITS=num_splits, CAUSAL=causal,
        PRECISION="ieee" if q_nope.dtype == torch.float32 else "tf32",
        UPCAST=q_nope.dtype == torch.bfloat16 and interp,
        num_warps=launch.num_warps, num_stages=launch.num_stages,
    )  # fmt: skip
    if num_splits == 1:
        return po[0].to(q_nope.dtype), plse[0]
    out, lse = merge_splits(po, plse)
    return out.to(q_nope.dtype), lse
