"""deepinfer.model: the Llama-family model runner, its weights, tokenizer and chat template.

Example::

    import torch
    from deepinfer.model import load_model

    loaded = load_model()  # the embedded SmolLM2-135M-Instruct (GGUF, converted once)
    ids = loaded.tokenizer.encode("The capital of France is")
    hidden, _ = loaded.model.forward_dense(torch.tensor([ids]))
    print(loaded.tokenizer.decode([int(loaded.model.compute_logits(hidden[0, -1]).argmax())]))
"""

from deepinfer.model.attention_metadata import AttentionMetadata
from deepinfer.model.chat_template import ChatTemplate, ChatTemplateError
from deepinfer.model.config import LlamaConfig, RopeScaling
from deepinfer.model.convert import cache_root, convert_gguf
from deepinfer.model.cpu_kernels import CpuKernels
from deepinfer.model.gguf_loader import load_gguf
from deepinfer.model.kv_pool import KVPool, OutOfBlocksError
from deepinfer.model.llama import LlamaModel
from deepinfer.model.loader import LoadedModel, build_model, load_model
from deepinfer.model.registry import default_model_path
from deepinfer.model.safetensors_loader import load_hf_dir, save_hf_dir
from deepinfer.model.spec_adapter import LlamaTargetAdapter
from deepinfer.model.tokenizer import IncrementalDetokenizer, Tokenizer

__all__ = [
    "AttentionMetadata",
    "ChatTemplate",
    "ChatTemplateError",
    "CpuKernels",
    "IncrementalDetokenizer",
    "KVPool",
    "LlamaConfig",
    "LlamaModel",
    "LlamaTargetAdapter",
    "LoadedModel",
    "OutOfBlocksError",
    "RopeScaling",
    "Tokenizer",
    "build_model",
    "cache_root",
    "convert_gguf",
    "default_model_path",
    "load_gguf",
    "load_hf_dir",
    "load_model",
    "save_hf_dir",
]
