"""deepinfer.models: the model runner (Llama, Qwen2/3, Mistral, DeepSeek-V2/V3), its weights,
tokenizer and chat template.

Example::

    import torch
    from deepinfer.models import load_model

    loaded = load_model()  # the embedded SmolLM2-135M-Instruct (GGUF, converted once)
    ids = loaded.tokenizer.encode("The capital of France is")
    hidden, _ = loaded.model.forward_dense(torch.tensor([ids]))
    print(loaded.tokenizer.decode([int(loaded.model.compute_logits(hidden[0, -1]).argmax())]))
"""

from typing import TYPE_CHECKING

from deepinfer.lazy_exports import lazy_exports

if TYPE_CHECKING:
    from deepinfer.models.attention_metadata import AttentionMetadata
    from deepinfer.models.chat_template import ChatTemplate, ChatTemplateError
    from deepinfer.models.config import LlamaConfig, RopeScaling
    from deepinfer.models.convert import cache_root, convert_gguf
    from deepinfer.models.deepseek import DeepseekModel
    from deepinfer.models.deepseek_config import DeepseekConfig
    from deepinfer.models.families import config_from_hf, model_class
    from deepinfer.models.gguf_loader import load_gguf
    from deepinfer.models.kv_pool import KVPool, OutOfBlocksError
    from deepinfer.models.llama import LlamaModel
    from deepinfer.models.loader import LoadedModel, build_model, load_model
    from deepinfer.models.qwen import Qwen3Model
    from deepinfer.models.registry import default_model_path
    from deepinfer.models.safetensors_loader import load_hf_dir, save_hf_dir
    from deepinfer.models.spec_adapter import LlamaTargetAdapter
    from deepinfer.models.tokenizer import IncrementalDetokenizer, Tokenizer
    from deepinfer_kernels.cpu import CpuKernels

# PEP 562 lazy re-exports ({name: module}): the torch-free parts (config, tokenizer, chat
# template, registry) import without torch, for the lean CPU runtime (`deepinfer.lean`).
_EXPORTS = {
    "AttentionMetadata": "deepinfer.models.attention_metadata",
    "ChatTemplate": "deepinfer.models.chat_template",
    "ChatTemplateError": "deepinfer.models.chat_template",
    "LlamaConfig": "deepinfer.models.config",
    "RopeScaling": "deepinfer.models.config",
    "cache_root": "deepinfer.models.convert",
    "convert_gguf": "deepinfer.models.convert",
    "DeepseekModel": "deepinfer.models.deepseek",
    "DeepseekConfig": "deepinfer.models.deepseek_config",
    "config_from_hf": "deepinfer.models.families",
    "model_class": "deepinfer.models.families",
    "load_gguf": "deepinfer.models.gguf_loader",
    "KVPool": "deepinfer.models.kv_pool",
    "OutOfBlocksError": "deepinfer.models.kv_pool",
    "LlamaModel": "deepinfer.models.llama",
    "LoadedModel": "deepinfer.models.loader",
    "build_model": "deepinfer.models.loader",
    "load_model": "deepinfer.models.loader",
    "Qwen3Model": "deepinfer.models.qwen",
    "default_model_path": "deepinfer.models.registry",
    "load_hf_dir": "deepinfer.models.safetensors_loader",
    "save_hf_dir": "deepinfer.models.safetensors_loader",
    "LlamaTargetAdapter": "deepinfer.models.spec_adapter",
    "IncrementalDetokenizer": "deepinfer.models.tokenizer",
    "Tokenizer": "deepinfer.models.tokenizer",
    "CpuKernels": "deepinfer_kernels.cpu",
}

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())


__all__ = [
    "AttentionMetadata",
    "ChatTemplate",
    "ChatTemplateError",
    "CpuKernels",
    "DeepseekConfig",
    "DeepseekModel",
    "IncrementalDetokenizer",
    "KVPool",
    "LlamaConfig",
    "LlamaModel",
    "LlamaTargetAdapter",
    "LoadedModel",
    "OutOfBlocksError",
    "Qwen3Model",
    "RopeScaling",
    "Tokenizer",
    "build_model",
    "cache_root",
    "config_from_hf",
    "convert_gguf",
    "default_model_path",
    "load_gguf",
    "load_hf_dir",
    "load_model",
    "model_class",
    "save_hf_dir",
]
