"""Readable torch references of the compiled CPU ops (:mod:`deepinfer_kernels.cpu`).

Each computes in fp64 and returns the operands' dtype: the specification the C kernels meet to
fp32 rounding. Weights are plain ``[out, in]`` matrices here; the kernels read the same values
as bf16 panels (:func:`unpack_panels_reference` is the layout).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from deepinfer_kernels.reference.quant import dequantize_reference

PANEL = 32  # output columns per panel


def unpack_panels_reference(panels: torch.Tensor, out_features: int) -> torch.Tensor:
    """The fp32 ``[out_features, K]`` weight held by bf16 panels ``[ceil(N/32), K, 16, 2]``:
    ``W[32 p + 16 h + i, k] = bf16(panels[p, k, i, h])``."""
    p, k, lanes, halves = panels.shape
    w = torch.empty(p * PANEL, k, dtype=torch.int16)
    for h in range(halves):
        for i in range(lanes):
            w[h * 16 + i :: PANEL] = panels[:, :, i, h]
    return w[:out_features].view(torch.bfloat16).float()


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``x / sqrt(mean(x^2) + eps) * weight`` (normalise, then scale: Hugging Face's order)."""
    x64 = x.double()
    normed = x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + eps)
    return (normed * weight.double()).to(x.dtype)


def add_rms_norm_reference(
    residual: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(r, rms_norm(r) * weight)`` with ``r = residual + delta`` (``residual`` when no delta)."""
    summed = residual if delta is None else residual + delta
    return summed, rms_norm_reference(summed, weight, eps)


def bf16_weight_linear_reference(
    x: torch.Tensor, panels: torch.Tensor, out_features: int, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """``x W^T + b`` with ``W`` the bf16 values the panels hold, fp64 sums."""
    w = unpack_panels_reference(panels, out_features).double()
    return F.linear(x.double(), w, None if bias is None else bias.double()).to(x.dtype)


def rope_reference(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate every head of ``x [T, heads, D]`` with full-width tables ``[T, D]``
    (``sin = [-sin a, sin a]``): ``y_i = x_i cos_i + x_{(i + D/2) mod D} sin_i``."""
    half = x.shape[-1] // 2
    swapped = torch.cat([x[..., half:], x[..., :half]], dim=-1)
    return x * cos[:, None, :] + swapped * sin[:, None, :]


def decoder_qkv_reference(
    x: torch.Tensor,
    qkv_weight: torch.Tensor,
    qkv_bias: torch.Tensor | None,
    cos: torch.Tensor,
    sin: torch.Tensor,
    slots: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    num_heads: int,
    num_kv_heads: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The layer before its attention: ``qkv = x Wqkv^T (+ b)``, RoPE on the Q and K heads,
    K/V rows written at ``slots`` of the caches ``[blocks, block_size, Hkv, D]``.

    Returns ``(qkv [T, (Hq + 2 Hkv) D], k_cache, v_cache)``; the caches are updated copies."""
    t, d = x.shape[0], cos.shape[-1]
    qkv = F.linear(x.double(), qkv_weight.double(), None if qkv_bias is None else qkv_bias.double())
    heads = qkv.view(t, num_heads + 2 * num_kv_heads, d)
    rotated = rope_reference(heads[:, : num_heads + num_kv_heads], cos.double(), sin.double())
    heads = torch.cat([rotated, heads[:, num_heads + num_kv_heads :]], dim=1)
    k = heads[:, num_heads : num_heads + num_kv_heads]
    v = heads[:, num_heads + num_kv_heads :]
    k_out, v_out = k_cache.clone(), v_cache.clone()
    k_out.view(-1, num_kv_heads, d)[slots.long()] = k.to(k_cache.dtype)
    v_out.view(-1, num_kv_heads, d)[slots.long()] = v.to(v_cache.dtype)
    return heads.reshape(t, -1).to(x.dtype), k_out, v_out


def decoder_mlp_reference(
    attn: torch.Tensor,
    o_weight: torch.Tensor,
    residual: torch.Tensor,
    post_norm: torch.Tensor,
    gate_up_weight: torch.Tensor,
    down_weight: torch.Tensor,
    next_norm: torch.Tensor,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The layer after its attention, and the next layer's input norm::

        r = residual + attn Wo^T;  n = rms_norm(r) * post_norm
        residual' = r + (silu(n Wg^T) * (n Wu^T)) Wd^T        (Wgu = [Wg; Wu])
        normed = rms_norm(residual') * next_norm

    Returns ``(residual', normed)``."""
    r = residual.double() + F.linear(attn.double(), o_weight.double())
    n = rms_norm_reference(r, post_norm, eps)
    gate, up = F.linear(n, gate_up_weight.double()).chunk(2, dim=-1)
    out = r + F.linear(F.silu(gate) * up, down_weight.double())
    return out.to(residual.dtype), rms_norm_reference(out, next_norm, eps).to(residual.dtype)


def block_rows_reference(parts: Sequence[tuple[torch.Tensor, int]]) -> torch.Tensor:
    """The fp32 matrix held by GGUF row segments stacked row-wise: ``parts`` = ``(data, qtype)``
    with ``data`` uint8 ``[rows, row_bytes]`` (the layout the block-format decoder layer reads)."""
    return torch.cat([dequantize_reference(data, qtype) for data, qtype in parts])


def quant_decoder_qkv_reference(
    x: torch.Tensor,
    qkv_parts: Sequence[tuple[torch.Tensor, int]],
    qkv_bias: torch.Tensor | None,
    cos: torch.Tensor,
    sin: torch.Tensor,
    slots: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    num_heads: int,
    num_kv_heads: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`decoder_qkv_reference` with the QKV weight given as GGUF row segments."""
    return decoder_qkv_reference(x, block_rows_reference(qkv_parts), qkv_bias, cos, sin, slots,
                                 k_cache, v_cache, num_heads, num_kv_heads)  # fmt: skip


def quant_decoder_mlp_reference(
    attn: torch.Tensor,
    o_parts: Sequence[tuple[torch.Tensor, int]],
    residual: torch.Tensor,
    post_norm: torch.Tensor,
    gate_up_parts: Sequence[tuple[torch.Tensor, int]],
    down_parts: Sequence[tuple[torch.Tensor, int]],
    next_norm: torch.Tensor,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`decoder_mlp_reference` with the weights given as GGUF row segments."""
    return decoder_mlp_reference(
        attn, block_rows_reference(o_parts), residual, post_norm,
        block_rows_reference(gate_up_parts), block_rows_reference(down_parts), next_norm, eps,
    )  # fmt: skip


def causal_prefill_attention_reference(
    qkv: torch.Tensor,
    num_heads: int,
    head_dim: int,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    start: int,
    scale: float,
) -> torch.Tensor:
    """fp32 ``[T, Hq, D]``: ``out[t, h] = softmax_{j <= start + t}(scale q[t, h] . k[j, h // g])
    @ v[j, h // g]`` in fp64, the queries in ``qkv[:, :Hq * D]`` at positions ``start + t``,
    key/value ``j`` in cache slot ``j`` (``[blocks, block_size, Hkv, D]``, slots in order),
    ``g = Hq / Hkv``."""
    t = qkv.shape[0]
    hkv = k_cache.shape[2]
    n = start + t
    q = qkv[:, : num_heads * head_dim].double().reshape(t, num_heads, head_dim)
    k = k_cache.reshape(-1, hkv, head_dim)[:n].double().repeat_interleave(num_heads // hkv, 1)
    v = v_cache.reshape(-1, hkv, head_dim)[:n].double().repeat_interleave(num_heads // hkv, 1)
    scores = torch.einsum("thd,jhd->htj", q, k) * scale
    later = torch.arange(n)[None, :] > (start + torch.arange(t))[:, None]  # key after query
    probs = scores.masked_fill(later, float("-inf")).softmax(-1)
    return torch.einsum("htj,jhd->thd", probs, v).float()
