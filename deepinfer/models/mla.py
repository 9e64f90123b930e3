"""Multi-head latent attention (DeepSeek-V2/V3) over a paged latent cache.

Per token the cache holds ``[c_kv | k_rope]``: the normed KV latent (``kv_lora_rank`` wide) and
the rotated key part shared by every head (``qk_rope_head_dim``). Keys and values are never
expanded: the key up-projection ``W_UK`` is absorbed into the query
(``q_nope W_UK`` scores directly against ``c_kv``), attention returns a latent per head, and the
value up-projection ``W_UV`` runs after it. That is the same function as expanding K and V per
head (what Hugging Face computes), at ``kv_lora_rank + rope`` cached values per token instead of
``2 x heads x head_dim``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

import deepinfer_kernels
from deepinfer.models.attention_metadata import AttentionMetadata
from deepinfer.models.deepseek_config import DeepseekConfig
from deepinfer.models.layers import Linear, RMSNorm
from deepinfer.models.rope import RotaryEmbedding


class MLAttention(nn.Module):
    """DeepSeek's attention: low-rank Q (``q_a_proj`` -> norm -> ``q_b_proj``, or one
    ``q_proj``), a joint KV latent (``kv_a_proj_with_mqa`` -> ``kv_a_layernorm``), per-head
    up-projection ``kv_b_proj``; names as in the Hugging Face checkpoints."""

    def __init__(self, config: DeepseekConfig, layer: int = 0) -> None:
        super().__init__()
        self.num_heads = config.num_heads
        self.nope_dim = config.qk_nope_head_dim
        self.rope_dim = config.qk_rope_head_dim
        self.v_dim = config.v_head_dim
        self.kv_lora_rank = config.kv_lora_rank
        self.interleaved = config.rope_interleave
        self.scale = config.softmax_scale
        h, q_width = config.hidden_size, config.num_heads * config.qk_head_dim
        self.q_proj: Linear | None = None
        self.q_a_proj: Linear | None = None
        self.q_a_layernorm: RMSNorm | None = None
        self.q_b_proj: Linear | None = None
        if config.q_lora_rank is None:
            self.q_proj = Linear(h, q_width)
        else:
            self.q_a_proj = Linear(h, config.q_lora_rank, bias=config.attention_bias)
            self.q_a_layernorm = RMSNorm(config.q_lora_rank, 1e-6)
            self.q_b_proj = Linear(config.q_lora_rank, q_width)
        self.kv_a_proj_with_mqa = Linear(h, config.latent_dim, bias=config.attention_bias)
        # Hugging Face's DeepSeek norms these two with their default eps (1e-6), not rms_norm_eps.
        self.kv_a_layernorm = RMSNorm(config.kv_lora_rank, 1e-6)
        self.kv_b_proj = Linear(
            config.kv_lora_rank, config.num_heads * (self.nope_dim + self.v_dim)
        )
        self.o_proj = Linear(config.num_heads * self.v_dim, h, bias=config.attention_bias)

    # ------------------------------------------------------------------ projections
    def _rotate(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rope: RotaryEmbedding
    ) -> torch.Tensor:
        if self.interleaved:
            # Pairs (x0, x1), (x2, x3)... become halves [x0 x2 ..., x1 x3 ...]: the
            # half-split rotation then rotates each original pair by its frequency.
            x = torch.cat((x[..., 0::2], x[..., 1::2]), dim=-1)
        return rope.apply(x, cos, sin)

    def project(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rope: RotaryEmbedding
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(q_absorbed [..., H, kv_lora_rank], q_rope [..., H, rope], c_kv [..., kv_lora_rank],
        k_rope [..., rope])`` of hidden states ``x [..., hidden]``."""
        if self.q_proj is not None:
            q = self.q_proj.forward(x)
        else:
            assert self.q_a_proj is not None and self.q_a_layernorm is not None
            assert self.q_b_proj is not None
            q = self.q_b_proj.forward(self.q_a_layernorm.forward(self.q_a_proj.forward(x)))
        q = q.view(*x.shape[:-1], self.num_heads, self.nope_dim + self.rope_dim)
        q_nope, q_rope = torch.split(q, [self.nope_dim, self.rope_dim], dim=-1)
        q_rope = self._rotate(q_rope, cos, sin, rope)
        latent = self.kv_a_proj_with_mqa.forward(x)
        c_kv, k_rope = torch.split(latent, [self.kv_lora_rank, self.rope_dim], dim=-1)
        c_kv = self.kv_a_layernorm.forward(c_kv.contiguous())
        k_rope = self._rotate(k_rope.unsqueeze(-2), cos, sin, rope).squeeze(-2)
        q_absorbed = torch.einsum("...hn,hnc->...hc", q_nope, self._w_uk())
        return q_absorbed, q_rope, c_kv, k_rope

    def _w_uk(self) -> torch.Tensor:
        """``W_UK [H, nope, kv_lora_rank]``: the key rows of ``kv_b_proj`` per head."""
        w = self.kv_b_proj.weight.view(self.num_heads, self.nope_dim + self.v_dim, -1)
        return w[:, : self.nope_dim]

    def _w_uv(self) -> torch.Tensor:
        """``W_UV [H, v_head_dim, kv_lora_rank]``: the value rows of ``kv_b_proj`` per head."""
        w = self.kv_b_proj.weight.view(self.num_heads, self.nope_dim + self.v_dim, -1)
        return w[:, self.nope_dim :]

    def _output(self, latent_out: torch.Tensor) -> torch.Tensor:
        """``o_proj`` of the per-head values ``W_UV`` applied to attention's latent output."""
        values = torch.einsum("...hc,hvc->...hv", latent_out, self._w_uv())
        return self.o_proj.forward(values.flatten(-2))

    # ------------------------------------------------------------------ attention
    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        rope: RotaryEmbedding,
        latent_cache: torch.Tensor,
        attn: AttentionMetadata,
        check_values: bool = True,
    ) -> torch.Tensor:
        """One layer over a flat ragged batch ``x [T, hidden]``: writes the batch's latents at
        ``attn.slot_mapping``, then attends over each sequence's cached latents.
        ``check_values=False`` skips the kernels' checks of the metadata values (a host sync
        on CUDA): the model checks them on its first layer only, every layer sees the same."""
        q_absorbed, q_rope, c_kv, k_rope = self.project(x, cos, sin, rope)
        deepinfer_kernels.write_latent_kv(
            c_kv, k_rope, latent_cache, attn.slot_mapping, check_values=check_values
        )
        out = deepinfer_kernels.mla_paged_attention(
            q_absorbed.contiguous(),
            q_rope.contiguous(),
            latent_cache,
            attn.block_table,
            attn.seq_lens,
            attn.cu_seqlens_q,
            scale=self.scale,
            causal=True,
            check_values=check_values,
        )
        return self._output(out)

    def forward_dense(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rope: RotaryEmbedding
    ) -> torch.Tensor:
        """Causal attention over ``x [B, S, hidden]`` without a cache (reference, training)."""
        q_absorbed, q_rope, c_kv, k_rope = self.project(x, cos, sin, rope)
        # One latent "head" shared by all query heads: scores from both parts, values = c_kv.
        q = torch.cat((q_absorbed, q_rope), dim=-1).transpose(1, 2)  # [B, H, S, C + R]
        k = torch.cat((c_kv, k_rope), dim=-1).unsqueeze(1)  # [B, 1, S, C + R]
        v = c_kv.unsqueeze(1)
        out = F.scaled_dot_product_attention(
            q, k.expand(-1, self.num_heads, -1, -1), v.expand(-1, self.num_heads, -1, -1),
            is_causal=True, scale=self.scale,
        )  # fmt: skip
        return self._output(out.transpose(1, 2))
