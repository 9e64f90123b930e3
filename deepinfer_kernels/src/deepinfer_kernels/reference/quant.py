"""Readable dequantisation of GGUF block formats, and the product a quantised linear computes.

The arithmetic follows ``gguf.quants`` step by step in fp32 (the tests check bit-identity on
random blocks of every type), so that a weight means the same number here, in the C and
Triton kernels and in any program that dequantises with the ``gguf`` package (transformers'
GGUF loading does). Every product below is exact in fp32 (an fp16 scale has 11 significant
bits, the integer factors at most 12 more), so the only rounding is the final ``+ m`` /
``- dm``, and an implementation that fuses it into an FMA gets the same bits.
"""

from __future__ import annotations

import torch

from deepinfer_kernels.quant.formats import BLOCK_GEOMETRY, QK_K, QuantType, quant_type


def _f16(b: torch.Tensor) -> torch.Tensor:
    """Little-endian fp16 stored in the last dim (2 bytes) of a uint8 tensor, as fp32."""
    return b.contiguous().view(torch.float16).to(torch.float32)


def _nibbles(qs: torch.Tensor, group: int) -> torch.Tensor:
    """Split bytes ``[..., n * group]`` into low then high nibbles per group of ``group``
    bytes: ``[..., n, 2, group]`` -> ``[..., n * 2 * group]`` (gguf's ``>> [0, 4]`` layout)."""
    q = qs.reshape(*qs.shape[:-1], -1, 1, group)
    shifts = torch.tensor([0, 4], dtype=torch.uint8, device=qs.device).view(2, 1)
    return ((q >> shifts) & 0x0F).reshape(*qs.shape[:-1], -1)


def _k_scale_min(scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The 8 six-bit scales and mins packed in 12 bytes (Q4_K / Q5_K), each ``[n, 8]``."""
    d, m, m_d = scales[:, 0:4], scales[:, 4:8], scales[:, 8:12]
    sc = torch.cat([d & 0x3F, (m_d & 0x0F) | ((d >> 2) & 0x30)], dim=-1)
    mn = torch.cat([m & 0x3F, (m_d >> 4) | ((m >> 2) & 0x30)], dim=-1)
    return sc, mn


def _q4_0(b: torch.Tensor) -> torch.Tensor:
    d = _f16(b[:, :2])
    q = _nibbles(b[:, 2:], 16).to(torch.int8) - 8
    return d * q.to(torch.float32)


def _q4_1(b: torch.Tensor) -> torch.Tensor:
    d, m = _f16(b[:, :2]), _f16(b[:, 2:4])
    q = _nibbles(b[:, 4:], 16).to(torch.float32)
    return d * q + m


def _q8_0(b: torch.Tensor) -> torch.Tensor:
    d = _f16(b[:, :2])
    return b[:, 2:].contiguous().view(torch.int8).to(torch.float32) * d


def _k_dequant(b: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """``(d * sc) * q - dmin * m`` per 32-element sub-block (Q4_K / Q5_K), ``q`` ``[n, 256]``."""
    n = b.shape[0]
    d, dmin = _f16(b[:, 0:2]), _f16(b[:, 2:4])
    sc, mn = _k_scale_min(b[:, 4:16])
    ds = (d * sc.to(torch.float32)).view(n, 8, 1)
    dm = (dmin * mn.to(torch.float32)).view(n, 8, 1)
    return (ds * q.view(n, 8, 32).to(torch.float32) - dm).view(n, QK_K)


def _q4_k(b: torch.Tensor) -> torch.Tensor:
    return _k_dequant(b, _nibbles(b[:, 16:], 32))


def _q5_k(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    qh = b[:, 16:48].reshape(n, 1, 32)
    bits = torch.arange(8, dtype=torch.uint8, device=b.device).view(8, 1)
    high = ((qh >> bits) & 1).reshape(n, QK_K)
    return _k_dequant(b, _nibbles(b[:, 48:], 32) | (high << 4))


def _q6_k(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    ql = _nibbles(b[:, :128], 64)  # element h*128 + s*64 + i
    qh = b[:, 128:192].reshape(n, 2, 1, 32)
    shifts = torch.tensor([0, 2, 4, 6], dtype=torch.uint8, device=b.device).view(4, 1)
    high = ((qh >> shifts) & 0x03).reshape(n, QK_K)  # element h*128 + s*32 + l
    q = (ql | (high << 4)).to(torch.int8) - 32
    scales = b[:, 192:208].contiguous().view(torch.int8).to(torch.float32)
    d = _f16(b[:, 208:210])
    ds = (d * scales).view(n, 16, 1)
    return (ds * q.view(n, 16, 16).to(torch.float32)).view(n, QK_K)


_BLOCK_DEQUANT = {
    QuantType.Q4_0: _q4_0,
    QuantType.Q4_1: _q4_1,
    QuantType.Q8_0: _q8_0,
    QuantType.Q4_K: _q4_k,
    QuantType.Q5_K: _q5_k,
    QuantType.Q6_K: _q6_k,
}


def dequantize_reference(data: torch.Tensor, qtype: int | QuantType) -> torch.Tensor:
    """fp32 values of raw GGUF bytes ``data`` uint8 ``[..., row_bytes]`` -> ``[..., cols]``.

    Bit-identical to ``gguf.quants.dequantize(data.numpy(), qtype)``.
    """
    qtype = quant_type(qtype)
    if data.dtype != torch.uint8:
        raise ValueError(f"data: expected uint8 bytes, got {data.dtype}")
    block, size = BLOCK_GEOMETRY[qtype]
    if data.dim() == 0 or data.shape[-1] % size:
        raise ValueError(f"data: the last dim must hold whole {qtype.name} blocks of {size} bytes")
    lead = data.shape[:-1]
    flat = data.contiguous()
    if qtype == QuantType.F32:
        return flat.view(torch.float32).clone()
    if qtype == QuantType.F16:
        return flat.view(torch.float16).to(torch.float32)
    if qtype == QuantType.BF16:
        return flat.view(torch.bfloat16).to(torch.float32)
    blocks = flat.reshape(-1, size)
    return _BLOCK_DEQUANT[qtype](blocks).reshape(*lead, data.shape[-1] // size * block)


def quant_linear_reference(
    x: torch.Tensor,
    data: torch.Tensor,
    qtype: int | QuantType,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """``x W^T (+ bias)`` in fp32 with ``W = dequantize_reference(data, qtype)``, in the
    dtype of ``x``."""
    w = dequantize_reference(data, qtype).to(x.device)
    y = x.to(torch.float32) @ w.t()
    if bias is not None:
        y = y + bias.to(torch.float32)
    return y.to(x.dtype)


def quant_swiglu_reference(
    x: torch.Tensor, data: torch.Tensor, qtype: int | QuantType
) -> torch.Tensor:
    """``silu(x Wg^T) * (x Wu^T)`` ``[..., rows / 2]`` with ``W = dequantize_reference(data,
    qtype)`` holding the gate's rows then the up's (a SwiGLU MLP's first half, what
    ``quant_swiglu`` fuses), in fp32 (float64 for float64 ``x``, for error bounds), in the dtype
    of ``x``."""
    if data.dim() != 2 or data.shape[0] % 2:
        raise ValueError(f"data: expected [2 * I, row_bytes] (gate, up), got {tuple(data.shape)}")
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    w = dequantize_reference(data, qtype).to(device=x.device, dtype=acc)
    gate, up = (x.to(acc) @ w.t()).chunk(2, dim=-1)
    return (torch.nn.functional.silu(gate) * up).to(x.dtype)
