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
