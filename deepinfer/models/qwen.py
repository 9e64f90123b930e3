"""Qwen2 and Qwen3 on the shared Llama decoder.

Qwen2 is the Llama decoder with biases on Q/K/V (``LlamaConfig.attention_bias``) and, when
``use_sliding_window`` is set, a sliding window on some layers (``layer_windows``): both are
options of :class:`~deepinfer.models.llama.LlamaModel`, which runs it as it is. Qwen3 adds an
RMSNorm over each head of Q and of K before the rotation (``qk_norm``); that is the one
difference :class:`Qwen3Attention` holds.
"""

from __future__ import annotations

from typing import ClassVar

import torch

from deepinfer.models.config import LlamaConfig
from deepinfer.models.layers import RMSNorm
from deepinfer.models.llama import LlamaAttention, LlamaModel
from deepinfer.models.rope import RotaryEmbedding


class Qwen3Attention(LlamaAttention):
    """Llama attention with ``q_norm`` / ``k_norm`` (weights ``[head_dim]``, shared by the
    heads) applied to each head of Q and K after the projection, before RoPE."""

    def __init__(self, config: LlamaConfig, layer: int = 0) -> None:
        super().__init__(config, layer)
        self.q_norm = RMSNorm(config.head_dim, config.rms_norm_eps)
        self.k_norm = RMSNorm(config.head_dim, config.rms_norm_eps)

    def project_qkv(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rope: RotaryEmbedding
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        qkv = self.qkv_proj.forward(x)
        heads = qkv.view(*qkv.shape[:-1], self.num_heads + 2 * self.num_kv_heads, self.head_dim)
        q, k, v = torch.split(heads, [self.num_heads, self.num_kv_heads, self.num_kv_heads], -2)
        q = rope.apply(self.q_norm.forward(q.contiguous()), cos, sin)
        k = rope.apply(self.k_norm.forward(k.contiguous()), cos, sin)
        return q, k, v


class Qwen3Model(LlamaModel):
    """Qwen3 (dense): :class:`LlamaModel` whose layers use :class:`Qwen3Attention`."""

    attention_class: ClassVar[type[LlamaAttention]] = Qwen3Attention
