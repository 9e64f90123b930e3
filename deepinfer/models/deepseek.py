"""`DeepseekModel`: DeepSeek-V2/V3 on the shared decoder (embedding, norms, head, rotary, KV
pool, engine interface of :class:`~deepinfer.models.llama.LlamaModel`).

What differs is the layer: multi-head latent attention over a latent KV pool
(:mod:`deepinfer.models.mla`), and from ``first_k_dense_replace`` on a mixture-of-experts MLP
with shared experts (:mod:`deepinfer.models.moe`); the first layers keep the dense SwiGLU MLP.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import cast

import torch
from torch import nn

from deepinfer.models.attention_metadata import AttentionMetadata
from deepinfer.models.config import LlamaConfig
from deepinfer.models.deepseek_config import DeepseekConfig
from deepinfer.models.kv_pool import KVPool
from deepinfer.models.layers import RMSNorm
from deepinfer.models.llama import LlamaMLP, LlamaModel
from deepinfer.models.mla import MLAttention
from deepinfer.models.moe import DeepseekMoE

_EXPERT = re.compile(r"layers\.(\d+)\.mlp\.experts\.(\d+)\.(gate|up|down)_proj\.weight$")
_LAYER = re.compile(r"layers\.(\d+)\.")
_GATE_UP = re.compile(r"(.*\.(?:mlp|shared_experts))\.(gate|up)_proj\.weight$")


class DeepseekDecoderLayer(nn.Module):
    def __init__(self, config: DeepseekConfig, layer: int) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = MLAttention(config, layer)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp: nn.Module = (
            DeepseekMoE(config) if config.is_moe_layer(layer) else LlamaMLP(config)
        )


class DeepseekModel(LlamaModel):
    """DeepSeek-V2/V3 causal LM. Its KV pool holds one latent page per layer and block
    (``KVPool.for_model`` reads the layout from the config)."""

    config: DeepseekConfig

    def __init__(self, config: LlamaConfig, *, init: bool = True) -> None:
        if not isinstance(config, DeepseekConfig):
            raise TypeError(f"config must be a DeepseekConfig, got {type(config).__name__}")
        super().__init__(config, init=init)

    def build_layer(self, config: LlamaConfig, layer: int) -> nn.Module:
        return DeepseekDecoderLayer(cast(DeepseekConfig, config), layer)

    def fused_layer_kernel_fits(self) -> bool:
        return False  # the compiled CPU layer is Llama's

    def mla_layers(self) -> list[DeepseekDecoderLayer]:
        return [cast(DeepseekDecoderLayer, layer) for layer in self.layers]

    def init_weights(self, std: float = 0.02, generator: torch.Generator | None = None) -> None:
        super().init_weights(std, generator)
        with torch.no_grad():
            for module in self.modules():
                if isinstance(module, DeepseekMoE):
                    for weight in (module.w_gate_up, module.w_down, module.gate.weight):
                        weight.normal_(0.0, std, generator=generator)
                    if module.gate.e_score_correction_bias is not None:
                        module.gate.e_score_correction_bias.zero_()

    # ------------------------------------------------------------------ forward
    def forward_with_layers(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        attn: AttentionMetadata,
        kv_pool: KVPool,
        layer_ids: Sequence[int],
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        self._check_inputs(input_ids, positions, attn.num_tokens)
        if kv_pool.num_layers != len(self.layers):
            raise ValueError(
                f"kv_pool has {kv_pool.num_layers} layers, the model has {len(self.layers)}"
            )
        if kv_pool.page_layout != self.config.kv_page_layout():
            raise ValueError(
                f"kv_pool pages are {kv_pool.page_layout} (planes, heads, width); this model "
                f"caches latents {self.config.kv_page_layout()}: build it with KVPool.for_model"
            )
        wanted = self._check_layer_ids(layer_ids)
        cos, sin = self.rope.cos_sin(positions, self.norm.weight.dtype)
        residual = self.embed_tokens.forward(input_ids)
        return self._run_layers(
            residual,
            lambda i, layer, x: layer.self_attn.forward(
                x, cos, sin, self.rope, kv_pool.latent_cache(i), attn, check_values=i == 0
            ),
            wanted,
            layer_ids,
        )

    def forward_dense(
        self, input_ids: torch.Tensor, layer_ids: Sequence[int] = ()
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        if input_ids.dim() != 2:
            raise ValueError(f"input_ids must be [B, S], got shape {tuple(input_ids.shape)}")
        wanted = self._check_layer_ids(layer_ids)
        self._check_ids(input_ids)
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        cos, sin = self.rope.cos_sin(positions, self.norm.weight.dtype)
        return self._run_layers(
            self.embed_tokens.forward(input_ids),
            lambda i, layer, x: layer.self_attn.forward_dense(x, cos, sin, self.rope),
            wanted,
            layer_ids,
        )

    def _run_layers(
        self,
        residual: torch.Tensor,
        attend: Callable[[int, DeepseekDecoderLayer, torch.Tensor], torch.Tensor],
        wanted: set[int],
        layer_ids: Sequence[int],
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Pre-norm residual blocks: ``attend(i, layer, normed)`` then the layer's MLP."""
        layers = self.mla_layers()
        first_norm = layers[0].input_layernorm if layers else self.norm
        residual, normed = self._add_norm(residual, None, first_norm)
        captured: dict[int, torch.Tensor] = {}
        for i, layer in enumerate(layers):
            h = attend(i, layer, normed)
            residual, normed = self._add_norm(residual, h, layer.post_attention_layernorm)
            h = cast(torch.Tensor, layer.mlp.forward(normed))
            residual, normed = self._add_norm(residual, h, self._norm_after(i))
            if i in wanted:
                captured[i] = residual
        return normed, [captured[i] for i in layer_ids]

    # ------------------------------------------------------------------ weights
    def own_state_from_hf(self, state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Hugging Face DeepSeek names -> this module's: per-expert matrices stacked into
        ``w_gate_up [E, 2I, H]`` / ``w_down [E, H, I]``, gate/up of dense and shared MLPs
        fused. Layers past ``num_hidden_layers`` (V3's multi-token-prediction module, which
        generation does not use) are left out."""
        cfg = self.config
        out: dict[str, torch.Tensor] = {}
        experts: dict[tuple[int, str], dict[int, torch.Tensor]] = {}
        halves: dict[str, dict[str, torch.Tensor]] = {}
        for name, tensor in state.items():
            key = name.removeprefix("model.")
            layer = _LAYER.match(key)
            if layer and int(layer.group(1)) >= cfg.num_layers:
                continue
            if key.endswith("rotary_emb.inv_freq"):
                continue
            if key == "lm_head.weight" and cfg.tie_word_embeddings:
                continue
            if m := _EXPERT.match(key):
                experts.setdefault((int(m.group(1)), m.group(3)), {})[int(m.group(2))] = tensor
            elif m := _GATE_UP.match(key):
                halves.setdefault(m.group(1), {})[m.group(2)] = tensor
            elif key.endswith(".mlp.experts.gate_up_proj"):  # transformers 5's stacked form
                out[key.replace(".experts.gate_up_proj", ".w_gate_up")] = tensor
            elif key.endswith(".mlp.experts.down_proj"):
                out[key.replace(".experts.down_proj", ".w_down")] = tensor
            else:
                out[key] = tensor
        for prefix, parts in halves.items():
            if set(parts) == {"gate", "up"}:
                out[f"{prefix}.gate_up_proj.weight"] = torch.cat([parts["gate"], parts["up"]])
        for i in range(cfg.num_layers):
            found = {k: experts.get((i, k), {}) for k in ("gate", "up", "down")}
            count = cfg.n_routed_experts
            if not any(found.values()):
                continue
            missing = [f"{k}[{e}]" for k, v in found.items() for e in range(count) if e not in v]
            if missing:
                raise ValueError(f"layer {i}: expert weights missing: {missing[:5]}")
            gate_up = [torch.cat([found["gate"][e], found["up"][e]]) for e in range(count)]
            out[f"layers.{i}.mlp.w_gate_up"] = torch.stack(gate_up)
            out[f"layers.{i}.mlp.w_down"] = torch.stack([found["down"][e] for e in range(count)])
        return out

    def hf_state_dict(self) -> dict[str, torch.Tensor]:
        """Weights under Hugging Face DeepSeek names (per-expert tensors, separate gate/up)."""
        out: dict[str, torch.Tensor] = {}
        for key, tensor in self.state_dict().items():
            if key.endswith(".w_gate_up"):
                prefix = key.removesuffix(".w_gate_up")
                for e, w in enumerate(tensor):
                    gate, up = w.chunk(2)
                    out[f"model.{prefix}.experts.{e}.gate_proj.weight"] = gate.contiguous()
                    out[f"model.{prefix}.experts.{e}.up_proj.weight"] = up.contiguous()
            elif key.endswith(".w_down"):
                prefix = key.removesuffix(".w_down")
                for e, w in enumerate(tensor):
                    out[f"model.{prefix}.experts.{e}.down_proj.weight"] = w.contiguous()
            elif key.endswith(".gate_up_proj.weight"):
                gate, up = tensor.chunk(2)
                prefix = key.removesuffix(".gate_up_proj.weight")
                out[f"model.{prefix}.gate_proj.weight"] = gate.contiguous()
                out[f"model.{prefix}.up_proj.weight"] = up.contiguous()
            elif key == "lm_head.weight":
                out[key] = tensor
            else:
                out[f"model.{key}"] = tensor
        return out
