# mypy: disable-error-code="no-untyped-def,untyped-decorator"
"""Baseline for the sampling benchmarks: the bisection kernel ``sample`` used before the
rejection sampler (#23 item 3), unchanged, so both run in the same process.

Triton kernel for ``sample``: filters by threshold search, no sort.

With ``e_i = exp(x_i / T - max_j x_j / T)`` (so ``p_i = e_i / sum e``), every filter keeps the
tokens at or above a threshold, found per row by a 32-step bisection over the order-preserving
integer image of the float32 logits:

* top-k: the largest key ``t`` with ``#{i : key_i >= t} >= k``;
* top-p: the largest key ``t`` with ``sum(e_i : key_i >= max(t, t_k)) >= top_p * sum(e_i :
  key_i >= t_k)``;
* min-p: ``e_i >= min_p`` (that is ``p_i >= min_p * max p``).

Then one inverse-CDF pass draws the token with the caller's uniform. A row pays for a
bisection (and for a pass computing its kept mass) only when its tile needs it, so
unfiltered sampling streams the row twice: once for the online max / sum, once to search.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from deepinfer_kernels._triton_util import row_tiles


@triton.jit
def _order_key(x):
    """Map float32 to int32 so that integer order equals float order."""
    bits = x.to(tl.int32, bitcast=True)
    return tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits).to(tl.int64)


@triton.jit
def _sample_kernel(
    lg_ptr, t_ptr, k_ptr, p_ptr, mp_ptr, u_ptr, out_ptr,
    B, V, s_lg_b, s_lg_v,
    BLOCK_B: tl.constexpr, BLOCK_V: tl.constexpr,
):  # fmt: skip
    rows = tl.program_id(0) * BLOCK_B + tl.arange(0, BLOCK_B)
    rmask = rows < B
    row_ptr = lg_ptr + rows.to(tl.int64) * s_lg_b
    temp = tl.load(t_ptr + rows, mask=rmask, other=1.0)
    greedy = temp == 0.0
    inv_t = 1.0 / tl.where(greedy, 1.0, temp)
    top_k = tl.load(k_ptr + rows, mask=rmask, other=0)
    top_p = tl.load(p_ptr + rows, mask=rmask, other=1.0)
    min_p = tl.load(mp_ptr + rows, mask=rmask, other=0.0)

    # Pass 1: row max (of x / T), argmax of x (lowest id on ties), online sum of e.
    m = tl.full([BLOCK_B], float("-inf"), dtype=tl.float32)
    s = tl.zeros([BLOCK_B], dtype=tl.float32)
    best = tl.full([BLOCK_B], float("-inf"), dtype=tl.float32)
    best_idx = tl.zeros([BLOCK_B], dtype=tl.int64)
    for v0 in range(0, V, BLOCK_V):
        cols = v0 + tl.arange(0, BLOCK_V)
        m2 = rmask[:, None] & (cols < V)[None, :]
        x = tl.load(row_ptr[:, None] + cols[None, :] * s_lg_v, mask=m2, other=float("-inf"))
        x = x.to(tl.float32)
        cmax = tl.max(x, axis=1)
        cidx = tl.min(tl.where(x == cmax[:, None], cols.to(tl.int64)[None, :], V), axis=1)
        better = cmax > best
        best_idx = tl.where(better, cidx, best_idx)
        best = tl.where(better, cmax, best)
        # A row that is -inf so far keeps a finite reference, so no inf - inf appears.
        m_new = tl.maximum(m, cmax * inv_t)
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
        e = tl.exp(x * inv_t[:, None] - m_ref[:, None])
        s = s * tl.exp(tl.where(m == float("-inf"), float("-inf"), m - m_ref))
        s += tl.sum(tl.where(m2, e, 0.0), axis=1)
        m = m_new

    m = tl.where(m == float("-inf"), 0.0, m)

    # Top-k threshold key (rows without top-k keep everything: key >= int32 min).
    lo_k = tl.full([BLOCK_B], -2147483648, dtype=tl.int64)
    need_k = rmask & ~greedy & (top_k > 0) & (top_k < V)
    if tl.max(need_k.to(tl.int32), axis=0) > 0:
        hi_k = tl.full([BLOCK_B], 2147483648, dtype=tl.int64)
        for _ in range(32):
            mid = lo_k + (hi_k - lo_k) // 2
            cnt = tl.zeros([BLOCK_B], dtype=tl.int64)
            for v0 in range(0, V, BLOCK_V):
                cols = v0 + tl.arange(0, BLOCK_V)
                m2 = need_k[:, None] & (cols < V)[None, :]
                x = tl.load(row_ptr[:, None] + cols[None, :] * s_lg_v, mask=m2, other=float("-inf"))
                keep = m2 & (_order_key(x.to(tl.float32)) >= mid[:, None])
                cnt += tl.sum(keep.to(tl.int64), axis=1)
            ok = cnt >= top_k
            lo_k = tl.where(ok, mid, lo_k)
            hi_k = tl.where(ok, hi_k, mid)
        lo_k = tl.where(need_k, lo_k, -2147483648)

    # Top-p threshold key over the top-k set.
    lo_p = lo_k
    need_p = rmask & ~greedy & (top_p < 1.0)
    if tl.max(need_p.to(tl.int32), axis=0) > 0:
        mass_k = tl.zeros([BLOCK_B], dtype=tl.float32)
        for v0 in range(0, V, BLOCK_V):
            cols = v0 + tl.arange(0, BLOCK_V)
            m2 = need_p[:, None] & (cols < V)[None, :]
            x = tl.load(row_ptr[:, None] + cols[None, :] * s_lg_v, mask=m2, other=float("-inf"))
            x = x.to(tl.float32)
            e = tl.exp(x * inv_t[:, None] - m[:, None])
            mass_k += tl.sum(tl.where(m2 & (_order_key(x) >= lo_k[:, None]), e, 0.0), axis=1)
        goal = top_p * mass_k
        hi_p = tl.full([BLOCK_B], 2147483648, dtype=tl.int64)
        for _ in range(32):
            mid = lo_p + (hi_p - lo_p) // 2
            mass = tl.zeros([BLOCK_B], dtype=tl.float32)
            for v0 in range(0, V, BLOCK_V):
                cols = v0 + tl.arange(0, BLOCK_V)
                m2 = need_p[:, None] & (cols < V)[None, :]
                x = tl.load(row_ptr[:, None] + cols[None, :] * s_lg_v, mask=m2, other=float("-inf"))
                x = x.to(tl.float32)
                e = tl.exp(x * inv_t[:, None] - m[:, None])
                mass += tl.sum(tl.where(m2 & (_order_key(x) >= mid[:, None]), e, 0.0), axis=1)
            ok = mass >= goal
            lo_p = tl.where(ok, mid, lo_p)
            hi_p = tl.where(ok, hi_p, mid)
        lo_p = tl.where(need_p, lo_p, lo_k)

    # Kept mass (an unfiltered row already has it from pass 1); then the inverse-CDF search.
    total = s
    filtered = rmask & ~greedy & (need_k | need_p | (min_p > 0.0))
    if tl.max(filtered.to(tl.int32), axis=0) > 0:
        kept_mass = tl.zeros([BLOCK_B], dtype=tl.float32)
        for v0 in range(0, V, BLOCK_V):
            cols = v0 + tl.arange(0, BLOCK_V)
            m2 = filtered[:, None] & (cols < V)[None, :]
            x = tl.load(row_ptr[:, None] + cols[None, :] * s_lg_v, mask=m2, other=float("-inf"))
            x = x.to(tl.float32)
            e = tl.exp(x * inv_t[:, None] - m[:, None])
            keep = m2 & (_order_key(x) >= lo_p[:, None]) & (e >= min_p[:, None])
            kept_mass += tl.sum(tl.where(keep, e, 0.0), axis=1)
        total = tl.where(filtered, kept_mass, s)
    target = tl.load(u_ptr + rows, mask=rmask, other=0.0) * total
    acc = tl.zeros([BLOCK_B], dtype=tl.float32)
    token = tl.full([BLOCK_B], -1, dtype=tl.int64)
    last_pos = tl.full([BLOCK_B], -1, dtype=tl.int64)
    for v0 in range(0, V, BLOCK_V):
        cols = v0 + tl.arange(0, BLOCK_V)
        m2 = rmask[:, None] & (cols < V)[None, :]
        x = tl.load(row_ptr[:, None] + cols[None, :] * s_lg_v, mask=m2, other=float("-inf"))
        x = x.to(tl.float32)
        e = tl.exp(x * inv_t[:, None] - m[:, None])
        keep = m2 & (_order_key(x) >= lo_p[:, None]) & (e >= min_p[:, None])
        w = tl.where(keep, e, 0.0)
        cdf = tl.cumsum(w, axis=1) + acc[:, None]
        cols64 = cols.to(tl.int64)[None, :]
        hit = tl.min(tl.where((cdf > target[:, None]) & (w > 0) & m2, cols64, V), axis=1)
        token = tl.where((token < 0) & (hit < V), hit, token)
        last_pos = tl.maximum(last_pos, tl.max(tl.where(w > 0, cols64, -1), axis=1))
        acc += tl.sum(w, axis=1)
    token = tl.where(token < 0, last_pos, token)
    tl.store(out_ptr + rows, tl.where(greedy, best_idx, token), mask=rmask)


def sample_bisection(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    min_p: torch.Tensor,
    uniforms: torch.Tensor,
) -> torch.Tensor:
    batch, vocab = logits.shape
    out = torch.empty((batch,), dtype=torch.int64, device=logits.device)
    if batch == 0:
        return out
    block_b, block_v = row_tiles(batch, vocab, logits.device)
    _sample_kernel[(triton.cdiv(batch, block_b),)](
        logits,
        temperature.to(torch.float32).contiguous(),
        top_k.to(torch.int64).contiguous(),
        top_p.to(torch.float32).contiguous(),
        min_p.to(torch.float32).contiguous(),
        uniforms.to(torch.float32).contiguous(),
        out, batch, vocab, logits.stride(0), logits.stride(1),
        BLOCK_B=block_b, BLOCK_V=block_v,
    )  # fmt: skip
    return out
