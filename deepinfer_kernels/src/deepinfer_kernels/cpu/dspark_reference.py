"""The DSpark greedy block and context entries in plain torch: the definition the compiled calls
of :mod:`deepinfer_kernels.cpu.dspark_draft` are tested against (equal up to fp32 rounding)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from deepinfer_kernels.cpu.dspark_weights import DraftBlockWeights, DraftContextWeights
from deepinfer_kernels.quant.ops import dequantize

__all__ = ["dspark_context_kv_reference", "dspark_greedy_draft_reference"]


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def dspark_greedy_draft_reference(
    weights: DraftBlockWeights,
    anchor_embed: torch.Tensor,
    anchor_ids: torch.Tensor,
    context: torch.Tensor,
    valid: torch.Tensor | None,
    num_tokens: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(tokens [B, m] int64, confidence [B, m], hidden [B, G, H])`` of the greedy block, in
    plain torch (the definition; see ``csrc/dspark_draft.c``)."""
    w = weights
    batch, width = int(context.shape[0]), int(context.shape[1])
    gamma, d = w.gamma, w.head_dim
    hq, hkv = w.num_heads, w.num_kv_heads
    kv = hkv * d
    x = torch.cat((anchor_embed[:, None].float(), w.mask_embed[None].expand(batch, -1, -1)), 1)
    cos, sin = w.rope_cos[-(width + gamma) :], w.rope_sin[-(width + gamma) :]
    keep = torch.ones(batch, width + gamma, dtype=torch.bool)
    if valid is not None:
        keep[:, :width] = valid
    for i, layer in enumerate(w.layers):
        h = _rms(x, layer.input_norm, w.eps)
        qkv = h @ layer.qkv.T
        q, k, v = torch.split(qkv, [hq * d, kv, kv], dim=-1)
        entries = context[..., 2 * i * kv : 2 * (i + 1) * kv].float()
        keys = torch.cat((entries[..., :kv], k), 1).view(batch, -1, hkv, d).transpose(1, 2)
        values = torch.cat((entries[..., kv:], v), 1).view(batch, -1, hkv, d).transpose(1, 2)
        q = q.view(batch, gamma, hq, d).transpose(1, 2)
        q, keys = _rotate(q, cos[width:], sin[width:]), _rotate(keys, cos, sin)
        rep = hq // hkv
        keys, values = keys.repeat_interleave(rep, 1), values.repeat_interleave(rep, 1)
        scores = (q @ keys.transpose(-1, -2)) / math.sqrt(d)
        scores = scores.masked_fill(~keep[:, None, None, :], float("-inf"))
        att = (scores.softmax(-1) @ values).transpose(1, 2).reshape(batch, gamma, hq * d)
        x = x + att @ layer.o.T
        n = _rms(x, layer.post_norm, w.eps)
        gate, up = (n @ layer.gate_up.T).chunk(2, dim=-1)
        x = x + (F.silu(gate) * up) @ layer.down.T
    head = dequantize(w.head_rows)
    base = _rms(x[:, :num_tokens], w.head_norm, w.head_eps) @ head.T
    tokens = torch.empty(batch, num_tokens, dtype=torch.int64)
    conf = torch.empty(batch, num_tokens)
    prev = anchor_ids.to(torch.int64)
    for j in range(num_tokens):
        e = w.markov_in[prev]
        index = torch.argmax(base[:, j] + e @ w.markov_out.T, dim=-1)
        prev = index if w.vocab_ids is None else w.vocab_ids[index]
        tokens[:, j] = prev
        z = torch.cat((x[:, j], e), -1) @ w.conf_w + w.conf_b
        conf[:, j] = torch.sigmoid(z)
    return tokens, conf, x


def dspark_context_kv_reference(
    weights: DraftContextWeights, features: torch.Tensor
) -> torch.Tensor:
    """Context entries ``[T, L * 2 * kv_dim]`` of raw features ``[T, F]``, in plain torch."""
    w = weights
    standard = (features.float() - w.shift) * w.scale
    return _rms(standard @ w.proj.T, w.norm, w.eps) @ w.kv.T
