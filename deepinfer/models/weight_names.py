"""Hugging Face ``LlamaForCausalLM`` weight names <-> the fused names of `LlamaModel`.

The model keeps Q/K/V as one ``qkv_proj`` and gate/up as one ``gate_up_proj`` (one matmul each);
checkpoints on disk keep Hugging Face's separate tensors.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from deepinfer.models.config import LlamaConfig


def hf_to_fused(state: Mapping[str, torch.Tensor], config: LlamaConfig) -> dict[str, torch.Tensor]:
    """Rename HF ``LlamaForCausalLM`` weights to this module's names, fusing Q/K/V and gate/up."""
    out: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        key = name.removeprefix("model.")
        if key == "lm_head.weight" and config.tie_word_embeddings:
            continue  # tied: the embedding is the head
        if (
            ".self_attn.q_proj." in key
            or ".self_attn.k_proj." in key
            or ".self_attn.v_proj." in key
        ):
            continue
        if ".mlp.gate_proj." in key or ".mlp.up_proj." in key:
            continue
        if key.endswith("rotary_emb.inv_freq"):
            continue
        out[key] = tensor
    for i in range(config.num_layers):
        prefix = f"model.layers.{i}."
        for suffix in ("weight", "bias"):
            parts = [state.get(f"{prefix}self_attn.{p}_proj.{suffix}") for p in "qkv"]
            if all(p is not None for p in parts):
                out[f"layers.{i}.self_attn.qkv_proj.{suffix}"] = torch.cat(parts, dim=0)  # type: ignore[arg-type]
        gate, up = (
            state.get(f"{prefix}mlp.gate_proj.weight"),
            state.get(f"{prefix}mlp.up_proj.weight"),
        )
        if gate is not None and up is not None:
            out[f"layers.{i}.mlp.gate_up_proj.weight"] = torch.cat([gate, up], dim=0)
    return out


def fused_to_hf(state: Mapping[str, torch.Tensor], config: LlamaConfig) -> dict[str, torch.Tensor]:
    """Inverse of :func:`hf_to_fused` (``lm_head.weight`` omitted when embeddings are tied)."""
    out: dict[str, torch.Tensor] = {}
    sizes = (config.q_size, config.kv_size, config.kv_size)
    for key, tensor in state.items():
        if ".qkv_proj." in key:
            layer, suffix = key.split(".self_attn.qkv_proj.")
            for p, part in zip("qkv", torch.split(tensor, list(sizes), dim=0)):
                out[f"model.{layer}.self_attn.{p}_proj.{suffix}"] = part.contiguous()
        elif ".gate_up_proj." in key:
            layer = key.split(".mlp.")[0]
            gate, up = torch.split(tensor, config.intermediate_size, dim=0)
            out[f"model.{layer}.mlp.gate_proj.weight"] = gate.contiguous()
            out[f"model.{layer}.mlp.up_proj.weight"] = up.contiguous()
        elif key == "lm_head.weight":
            out[key] = tensor
        else:
            out[f"model.{key}"] = tensor
    return out
