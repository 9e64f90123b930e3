"""Building blocks of the drafter backbone: RMSNorm, rotary embeddings, one draft layer."""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from deepinfer_spec.linear import LinearFn, module_linear


class RMSNorm(nn.Module):
    """``y = x / sqrt(mean(x^2) + eps) * weight`` over the last dimension."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * self.weight.float()).to(x.dtype)


def rope_tables(
    positions: torch.Tensor, head_dim: int, theta: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``cos``, ``sin`` ``[T, head_dim / 2]`` (fp32) of the angles ``positions[t] * theta^(-2i/d)``."""
    half = head_dim // 2
    inv = theta ** (
        -torch.arange(half, device=positions.device, dtype=torch.float32) * 2.0 / head_dim
    )
    ang = positions.to(torch.float32)[:, None] * inv[None, :]
    return ang.cos(), ang.sin()


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate pairs ``(x_i, x_{i+d/2})`` of ``x [B, heads, T, d]`` by the angles of the tables."""
    half = x.shape[-1] // 2
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


class RopeTables(NamedTuple):
    """:func:`rope_tables` of a layer's query and key positions."""

    q_cos: torch.Tensor
    q_sin: torch.Tensor
    k_cos: torch.Tensor
    k_sin: torch.Tensor

    @classmethod
    def at(
        cls, q_pos: torch.Tensor, k_pos: torch.Tensor, head_dim: int, theta: float
    ) -> RopeTables:
        """Tables for query positions ``q_pos`` and key positions ``k_pos``.

        Attention scores then depend on positions only through their difference, so the drafter
        can number positions relative to the anchor and be independent of the sequence length.
        """
        return cls(*rope_tables(q_pos, head_dim, theta), *rope_tables(k_pos, head_dim, theta))


class DraftLayer(nn.Module):
    """Pre-norm transformer layer whose keys/values are ``[context ; block]``.

    The block's queries attend bidirectionally to the whole block and to the valid context
    positions. The context is already projected and normed by the drafter, so it goes into the
    key/value projections as is; a caller that keeps the context's keys and values
    (:meth:`context_kv`) passes them instead and skips those projections. Parameter names follow
    the Llama convention so that weights of a target layer can be copied in (see
    ``DSparkDrafter.init_backbone_from_target``).
    """

    def __init__(
        self,
        hidden: int,
        num_heads: int,
        num_kv_heads: int,
        intermediate: int,
        eps: float,
        theta: float,
    ) -> None:
        super().__init__()
        if hidden % num_heads or (hidden // num_heads) % 2:
            raise ValueError(
                f"num_heads: hidden size {hidden} must split into {num_heads} heads of even size"
            )
        self.num_heads, self.num_kv_heads = num_heads, num_kv_heads
        self.head_dim = hidden // num_heads
        self.theta = theta
        self.input_layernorm = RMSNorm(hidden, eps)
        self.q_proj = nn.Linear(hidden, num_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(hidden, num_kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(hidden, num_kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(num_heads * self.head_dim, hidden, bias=False)
        self.post_attention_layernorm = RMSNorm(hidden, eps)
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    @property
    def kv_dim(self) -> int:
        """Width of one position's keys (and of its values): ``num_kv_heads * head_dim``."""
        return self.num_kv_heads * self.head_dim

    def context_kv(
        self, context: torch.Tensor, linear: LinearFn = module_linear
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys (before the rotation) and values ``[..., kv_dim]`` of projected context
        positions ``[..., H]``: what :meth:`forward` computes for them on every call."""
        return linear(context, self.k_proj), linear(context, self.v_proj)

    def forward(
        self,
        x: torch.Tensor,
        context: torch.Tensor | tuple[torch.Tensor, torch.Tensor],
        attn_mask: torch.Tensor | None,
        rope: RopeTables,
        linear: LinearFn = module_linear,
    ) -> torch.Tensor:
        """``x [B, G, H]``, ``attn_mask [B, 1, G or 1, W + G]`` (True = attend; ``None``: every
        key is valid).

        ``context``: the projected context ``[B, W, H]``, or its :meth:`context_kv`
        ``(keys, values)``, each ``[B, W, kv_dim]``. A decoder keeps the latter for the positions
        it has seen: the context's key and value projections were about three fifths of the SmolLM2
        drafter.s backbone arithmetic, recomputed for all ``W`` positions on every proposal.

        ``rope``: the rotation of the ``G`` queries and ``W + G`` keys. The caller builds it once
        for all layers (the drafter keeps it for every relative position): recomputing
        ``cos``/``sin`` for every key cost the SmolLM2 drafter 0.6 of its 8.5 ms per greedy
        proposal on the 2-core CPU. Keys are stored unrotated because the rotation depends on
        the position relative to the anchor, which moves every step.

        ``linear``: how the products run (:class:`~deepinfer_spec.linear.LinearFn`).
        """
        b, g, _ = x.shape
        h = self.input_layernorm(x)
        if isinstance(context, tuple):
            k_ctx, v_ctx = context
            k_blk, v_blk = self.context_kv(h, linear)
            k_in = torch.cat((k_ctx.to(k_blk.dtype), k_blk), dim=1)
            v_in = torch.cat((v_ctx.to(v_blk.dtype), v_blk), dim=1)
        else:
            k_in, v_in = self.context_kv(torch.cat((context, h), dim=1), linear)
        q = linear(h, self.q_proj).view(b, g, self.num_heads, self.head_dim).transpose(1, 2)
        k = k_in.view(b, -1, self.num_kv_heads, self.head_dim).transpose(1, 2)
        v = v_in.view(b, -1, self.num_kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rotary(q, rope.q_cos, rope.q_sin), apply_rotary(k, rope.k_cos, rope.k_sin)
        rep = self.num_heads // self.num_kv_heads
        if rep > 1:
            # Grouped queries: the ``rep`` query heads of one key/value head become ``rep * G``
            # query rows of one attention over that head's keys. Copying the keys and values
            # ``rep`` times instead (repeat_interleave) was 0.13 of the SmolLM2 drafter's CPU
            # backbone, for a block of 5 queries over 133 keys.
            q = q.reshape(b, self.num_kv_heads, rep * g, self.head_dim)
            if attn_mask is not None and attn_mask.shape[-2] != 1:
                attn_mask = attn_mask.repeat(1, 1, rep, 1)
        att = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)
        att = att.view(b, self.num_heads, g, self.head_dim)
        x = x + linear(att.transpose(1, 2).reshape(b, g, -1), self.o_proj)
        h = self.post_attention_layernorm(x)
        mlp = F.silu(linear(h, self.gate_proj)) * linear(h, self.up_proj)
        out: torch.Tensor = x + linear(mlp, self.down_proj)
        return out
