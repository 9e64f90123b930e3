"""Which model class runs a checkpoint: one entry per Hugging Face ``model_type``.

Llama, Qwen2 and Mistral run on :class:`~deepinfer.models.llama.LlamaModel` (biases and
sliding windows are its config options), Qwen3 on :class:`~deepinfer.models.qwen.Qwen3Model`,
DeepSeek-V2/V3 on :class:`~deepinfer.models.deepseek.DeepseekModel` (MLA, MoE).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from deepinfer.models.config import LlamaConfig, hf_model_type
from deepinfer.models.deepseek import DeepseekModel
from deepinfer.models.deepseek_config import DEEPSEEK_ARCHITECTURES, DeepseekConfig
from deepinfer.models.llama import LlamaModel
from deepinfer.models.qwen import Qwen3Model


def config_from_hf(raw: Mapping[str, Any]) -> LlamaConfig:
    """The config of a ``config.json`` dict, for whichever supported family it names
    (``ValueError`` naming what is not supported)."""
    if hf_model_type(raw) in DEEPSEEK_ARCHITECTURES:
        return DeepseekConfig.from_hf_config(raw)
    return LlamaConfig.from_hf_config(raw)


def model_class(config: LlamaConfig) -> type[LlamaModel]:
    """The module class that implements ``config``'s family."""
    if isinstance(config, DeepseekConfig):
        return DeepseekModel
    return Qwen3Model if config.qk_norm else LlamaModel


__all__ = ["config_from_hf", "hf_model_type", "model_class"]
