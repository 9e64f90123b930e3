"""The layers of a Llama-family decoder: GQA attention over the paged KV pool, the SwiGLU MLP
and the decoder layer that holds them with its two norms (:class:`~deepinfer.models.llama.LlamaModel`
runs them over a flat ragged batch)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

import deepinfer_kernels
from deepinfer.models.attention_metadata import AttentionMetadata
from deepinfer.models.config import LlamaConfig
from deepinfer.models.layers import Linear, RMSNorm
from deepinfer.models.rope import RotaryEmbedding
from deepinfer_kernels.cpu import PagedAttentionTiles

__all__ = ["LlamaAttention", "LlamaDecoderLayer", "LlamaMLP"]


class LlamaAttention(nn.Module):
    """GQA self-attention: ``softmax(q k^T / sqrt(D) + causal mask) v`` over the paged cache,
    within the layer's sliding window when it has one (Mistral)."""

    def __init__(self, config: LlamaConfig, layer: int = 0) -> None:
        super().__init__()
        self.window = config.window_of(layer)
        self.num_heads = config.num_heads
        self.num_kv_heads = config.num_kv_heads
        self.head_dim = config.head_dim
        self.q_size = config.q_size
        self.kv_size = config.kv_size
        self.scale = config.head_dim**-0.5
        self.qkv_proj = Linear(
            config.hidden_size, self.q_size + 2 * self.kv_size, bias=config.attention_bias
        )
        self.o_proj = Linear(self.q_size, config.hidden_size)

    def project_qkv(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rope: RotaryEmbedding
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        qkv = self.qkv_proj.forward(x)
        lead = qkv.shape[:-1]
        heads = qkv.view(*lead, self.num_heads + 2 * self.num_kv_heads, self.head_dim)
        # Q and K heads are rotated together: one rotation over Hq + Hkv heads.
        qk = rope.apply(heads[..., : self.num_heads + self.num_kv_heads, :], cos, sin)
        q, k = torch.split(qk, [self.num_heads, self.num_kv_heads], dim=-2)
        return q, k, heads[..., self.num_heads + self.num_kv_heads :, :]

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        rope: RotaryEmbedding,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        plan: deepinfer_kernels.PagedAttentionPlan,
        writer: deepinfer_kernels.WriteKVPlan,
    ) -> torch.Tensor:
        """One layer's paged attention. ``plan`` (:meth:`plan_attention`) and ``writer``
        (``deepinfer_kernels.plan_write_kv``) are built once per forward and shared by every
        layer: the batch's metadata is checked and its tiles, pages and slots derived once."""
        q, k, v = self.project_qkv(x, cos, sin, rope)
        writer.run(k, v, k_cache, v_cache)
        return self.o_proj.forward(plan.run(q, k_cache, v_cache).flatten(-2))

    def plan_attention(
        self,
        attn: AttentionMetadata,
        block_size: int,
        cpu_kernel: PagedAttentionTiles | None = None,
    ) -> deepinfer_kernels.PagedAttentionPlan:
        """Validate ``attn`` once and precompute the layer-independent attention work
        (``cpu_kernel``: see ``deepinfer_kernels.plan_paged_attention``)."""
        return deepinfer_kernels.plan_paged_attention(
            attn.block_table,
            attn.seq_lens,
            attn.cu_seqlens_q,
            block_size=block_size,
            num_q_heads=self.num_heads,
            num_kv_heads=self.num_kv_heads,
            head_dim=self.head_dim,
            scale=self.scale,
            causal=True,
            sliding_window=self.window or None,
            cpu_kernel=cpu_kernel,
        )

    def forward_dense(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rope: RotaryEmbedding
    ) -> torch.Tensor:
        """Plain causal attention over ``x`` ``[B, S, H]`` with no cache (training, reference)."""
        q, k, v = self.project_qkv(x, cos, sin, rope)
        mask = None
        if self.window:
            pos = torch.arange(x.shape[-2], device=x.device)
            diff = pos[:, None] - pos[None, :]
            mask = (diff >= 0) & (diff < self.window)  # key j in (p - window, p]
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2),
            k.transpose(1, 2),
            v.transpose(1, 2),
            attn_mask=mask,
            is_causal=mask is None,
            scale=self.scale,
            enable_gqa=self.num_heads != self.num_kv_heads,
        )
        return self.o_proj.forward(out.transpose(1, 2).flatten(-2))


class LlamaMLP(nn.Module):
    """SwiGLU: ``down(silu(gate(x)) * up(x))``."""

    def __init__(self, config: LlamaConfig, intermediate_size: int | None = None) -> None:
        super().__init__()
        size = config.intermediate_size if intermediate_size is None else intermediate_size
        self.intermediate_size = size
        self.gate_up_proj = Linear(config.hidden_size, 2 * size)
        self.down_proj = Linear(size, config.hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Block-format weights on the CPU: gate, up and silu * up in one compiled pass where it
        # applies (a prefill; quant_layers.QuantLinear.gated_product), without the [T, 2 I]
        # product in memory.
        gated = getattr(self.gate_up_proj, "gated_product", None)
        if gated is not None and (act := gated(x)) is not None:
            return self.down_proj.forward(act, contiguous=False)
        # Transposed views are fine here: chunk, silu and mul are element-wise, and the down
        # projection's transposed product wants exactly the transposed operand.
        gate, up = self.gate_up_proj.forward(x, contiguous=False).chunk(2, dim=-1)
        # The projection's output is this call's own buffer: silu in place (exact) saves a
        # [T, intermediate] allocation and a pass over it (a 1.2k-row prefill: 7 MB a layer).
        # Not where autograd needs silu's input for the backward.
        in_place = not (torch.is_grad_enabled() and gate.requires_grad)
        return self.down_proj.forward(F.silu(gate, inplace=in_place).mul_(up), contiguous=False)


class LlamaDecoderLayer(nn.Module):
    def __init__(
        self, config: LlamaConfig, layer: int = 0, attention: type[LlamaAttention] = LlamaAttention
    ) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = attention(config, layer)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = LlamaMLP(config)
