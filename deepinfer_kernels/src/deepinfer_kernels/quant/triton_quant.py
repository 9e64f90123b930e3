# mypy: disable-error-code="no-untyped-def,untyped-decorator"
"""Triton ``x W^T`` with ``W`` in a GGUF block format, dequantised tile by tile in registers.

Each program owns a ``BLOCK_M x BLOCK_N`` tile of the output and walks ``K`` in steps of
``BLOCK_K``: it loads the raw bytes of its ``BLOCK_N`` weight rows for that step, decodes them to
fp32 exactly as :mod:`deepinfer_kernels.reference.quant` does (every product there is exact in
fp32, so contraction into FMAs cannot change a value), and accumulates in fp32. ``W`` is never
written out: a decode step reads ``rows * row_bytes`` bytes of weights, 4-8x fewer than fp32.
Few rows (decode) use a broadcast multiply-sum; 16 rows or more use ``tl.dot`` in IEEE fp32
(no TF32, so the result matches the reference to fp32 rounding).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from deepinfer_kernels.quant.formats import BLOCK_GEOMETRY, QuantType

_FLOAT_VIEW = {
    QuantType.F32: torch.float32,
    QuantType.F16: torch.float16,
    QuantType.BF16: torch.bfloat16,
}


@triton.jit
def _f16(ptr, mask):
    lo = tl.load(ptr, mask=mask, other=0).to(tl.uint16)
    hi = tl.load(ptr + 1, mask=mask, other=0).to(tl.uint16)
    return (lo | (hi << 8)).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _dequant_tile(w_ptr, n, k, row_bytes, mask, QTYPE: tl.constexpr, K: tl.constexpr):
    """fp32 weights ``W[n, k]`` for index grids ``n`` ``[BN, 1]`` and ``k`` ``[1, BK]``."""
    if QTYPE == 0 or QTYPE == 1 or QTYPE == 30:  # F32 / F16 / BF16: a typed view of the rows
        w = tl.load(w_ptr + n * K + k, mask=mask, other=0.0).to(tl.float32)
    elif QTYPE == 2 or QTYPE == 3 or QTYPE == 8:  # 32-element blocks
        if QTYPE == 2:
            ts = 18
        elif QTYPE == 3:
            ts = 20
        else:
            ts = 34
        base = w_ptr + n * row_bytes + (k // 32) * ts
        within = k % 32
        d = _f16(base, mask)
        if QTYPE == 8:
            q = tl.load(base + 2 + within, mask=mask, other=0).to(tl.int8, bitcast=True)
            w = q.to(tl.float32) * d
        else:
            off = 2 if QTYPE == 2 else 4
            byte = tl.load(base + off + within % 16, mask=mask, other=0)
            q = ((byte >> ((within // 16) * 4).to(tl.uint8)) & 0x0F).to(tl.int32)
            if QTYPE == 2:
                w = d * (q - 8).to(tl.float32)
            else:
                w = d * q.to(tl.float32) + _f16(base + 2, mask)
    elif QTYPE == 12 or QTYPE == 13:  # Q4_K / Q5_K: 8 sub-blocks of 32, 6-bit scales and mins
        ts = 144 if QTYPE == 12 else 176
        base = w_ptr + n * row_bytes + (k // 256) * ts
        e = k % 256
        j = e // 32
        lane = e % 32
        s = base + 4
        lo4 = j < 4
        a = tl.load(s + j, mask=mask, other=0)  # j < 4: the scale; else the min's high bits
        b = tl.load(s + j + 4, mask=mask, other=0)
        c = tl.load(s + tl.where(lo4, j, j - 4), mask=mask, other=0)
        sc = tl.where(lo4, a & 63, (b & 0x0F) | ((c >> 2) & 0x30)).to(tl.int32)
        mn = tl.where(lo4, b & 63, (b >> 4) | ((a >> 2) & 0x30)).to(tl.int32)
        qs_off = 16 if QTYPE == 12 else 48
        byte = tl.load(base + qs_off + (j // 2) * 32 + lane, mask=mask, other=0)
        q = ((byte >> ((j % 2) * 4).to(tl.uint8)) & 0x0F).to(tl.int32)
        if QTYPE == 13:
            hb = tl.load(base + 16 + lane, mask=mask, other=0).to(tl.int32)
            q = q | (((hb >> j) & 1) << 4)
        ds = _f16(base, mask) * sc.to(tl.float32)
        dm = _f16(base + 2, mask) * mn.to(tl.float32)
        w = ds * q.to(tl.float32) - dm
    else:  # Q6_K
        base = w_ptr + n * row_bytes + (k // 256) * 210
        e = k % 256
        h = e // 128
        r = e % 128
        lo = tl.load(base + h * 64 + r % 64, mask=mask, other=0)
        lo = (lo >> ((r // 64) * 4).to(tl.uint8)) & 0x0F
        hi = tl.load(base + 128 + h * 32 + r % 32, mask=mask, other=0)
        hi = (hi >> ((r // 32) * 2).to(tl.uint8)) & 0x03
        q = (lo.to(tl.int32) | (hi.to(tl.int32) << 4)) - 32
        scale = tl.load(base + 192 + e // 16, mask=mask, other=0).to(tl.int8, bitcast=True)
        w = (_f16(base + 208, mask) * scale.to(tl.float32)) * q.to(tl.float32)
    return w


@triton.jit
def _quant_linear_kernel(
    x_ptr, w_ptr, b_ptr, y_ptr, M, N, row_bytes, stride_xm,
    K: tl.constexpr, QTYPE: tl.constexpr, HAS_BIAS: tl.constexpr, USE_DOT: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n = offs_n[:, None]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        k = offs_k[None, :]
        x_mask = (offs_m[:, None] < M) & (k < K)
        x = tl.load(x_ptr + offs_m[:, None] * stride_xm + k, mask=x_mask, other=0.0)
        x = x.to(tl.float32)
        w_mask = (n < N) & (k < K)
        w = _dequant_tile(w_ptr, n, k, row_bytes, w_mask, QTYPE, K)
        w = tl.where(w_mask, w, 0.0)
        if USE_DOT:
            acc += tl.dot(x, tl.trans(w), input_precision="ieee")
        else:
            acc += tl.sum(x[:, None, :] * w[None, :, :], axis=2)
    if HAS_BIAS:
        acc += tl.load(b_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)[None, :]
    y_mask = (offs_m[:, None] < M) & (n.reshape(1, BLOCK_N) < N)
    tl.store(y_ptr + offs_m[:, None] * N + offs_n[None, :], acc, mask=y_mask)


def quant_linear_triton(
    x: torch.Tensor,
    data: torch.Tensor,
    qtype: QuantType,
    cols: int,
    bias: torch.Tensor | None,
) -> torch.Tensor:
    """``x [M, cols] @ W^T (+ bias)`` in fp32, returned in ``x``'s dtype."""
    rows, n = x.shape[0], data.shape[0]
    x = x.contiguous()
    w = data.view(_FLOAT_VIEW[qtype]) if qtype in _FLOAT_VIEW else data
    y = torch.empty(rows, n, dtype=torch.float32, device=x.device)
    if rows == 0 or n == 0:
        return y.to(x.dtype)
    block = BLOCK_GEOMETRY[qtype][0]
    use_dot = rows >= 16
    block_m = 16 if use_dot else triton.next_power_of_2(max(rows, 1))
    block_m = min(block_m, 16)
    block_n = 32 if use_dot else 16
    # A K step covers whole 32-element groups (one scale per group); K-quants' 256-element
    # super-blocks are decoded across steps by index arithmetic.
    block_k = 64 if block != 1 else min(64, triton.next_power_of_2(cols))
    grid = (triton.cdiv(rows, block_m), triton.cdiv(n, block_n))
    _quant_linear_kernel[grid](
        x, w, bias if bias is not None else y, y, rows, n, data.shape[1], x.stride(0),
        K=cols, QTYPE=int(qtype), HAS_BIAS=bias is not None, USE_DOT=use_dot,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
    )  # fmt: skip
    return y.to(x.dtype)
