"""Read a llama.cpp GGUF file under Hugging Face names: as float tensors, or with its matrices
kept in their block formats (:func:`load_gguf_blocks`)."""

from __future__ import annotations

import os
import re
from typing import Any

import numpy as np
import torch

from deepinfer.models.config import LlamaConfig
from deepinfer_kernels.quant import QuantType, QuantWeight

_LAYER_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
# GGUF types kept as raw blocks (F32 matrices are already the compute format).
_BLOCK_TYPES = {int(t) for t in QuantType if t != QuantType.F32}
_BLOCK = re.compile(r"^blk\.(\d+)\.([a-z_]+)\.(weight|bias)$")


def hf_name(gguf_name: str) -> str | None:
    """The Hugging Face name of a llama.cpp tensor name, or None for tensors we do not use."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    match = _BLOCK.match(gguf_name)
    if match is None or match.group(2) not in _LAYER_NAMES:
        return None
    layer, part, kind = match.groups()
    return f"model.layers.{layer}.{_LAYER_NAMES[part]}.{kind}"


def permute_rotary(weight: torch.Tensor, num_heads: int) -> torch.Tensor:
    """llama.cpp's Q/K row order from Hugging Face's: within each head, interleave the halves.

    Row ``h*D + 2i + j`` of the result is row ``h*D + j*D/2 + i`` of the input (``j`` in {0, 1}),
    which turns HF's half-split rotary pairs ``(i, i + D/2)`` into llama.cpp's adjacent pairs.
    """
    rows = weight.shape[0]
    return (
        weight.reshape(num_heads, 2, rows // num_heads // 2, *weight.shape[1:])
        .transpose(1, 2)
        .reshape(weight.shape)
    )


def unpermute_rotary(weight: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Inverse of :func:`permute_rotary`: llama.cpp's adjacent rotary pairs back to half-split."""
    rows = weight.shape[0]
    return (
        weight.reshape(num_heads, rows // num_heads // 2, 2, *weight.shape[1:])
        .transpose(1, 2)
        .reshape(weight.shape)
    )


def open_gguf(path: str | os.PathLike[str]) -> Any:
    """A ``gguf.GGUFReader`` over ``path`` (memory-mapped), with a clear error for bad files."""
    import gguf

    path = os.fspath(path)
    if not os.path.isfile(path):
        raise ValueError(f"GGUF path {path!r} is not a file")
    try:
        return gguf.GGUFReader(path)
    except Exception as exc:  # the reader raises ValueError/struct.error on garbage
        raise ValueError(f"{path!r} is not a readable GGUF file: {exc}") from exc


def dequantize_tensor(tensor: Any) -> np.ndarray:
    """A GGUF tensor as a float32 numpy array in row-major (PyTorch) shape."""
    import gguf

    data = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
    shape = tuple(int(d) for d in reversed(tensor.shape))  # GGUF lists dims fastest-first
    out = np.ascontiguousarray(data, dtype=np.float32).reshape(shape)
    # Unquantised tensors come back as views of the read-only memory map.
    return out if out.flags.writeable else out.copy()


def load_gguf_state_dict(reader: Any, config: LlamaConfig) -> dict[str, torch.Tensor]:
    """Every used tensor of a GGUF file, dequantised to fp32, under HF ``LlamaForCausalLM`` names.

    For the ``llama`` architecture the Q and K rows get llama.cpp's rotary permutation undone
    (its converter interleaves them for GPT-J style rotation); ``qwen2`` files use NeoX rotation
    and are stored unpermuted. The result is exactly what a Hugging Face checkpoint holds.
    """
    arch_field = reader.fields.get("general.architecture")
    permuted = arch_field is None or arch_field.contents() == "llama"
    state: dict[str, torch.Tensor] = {}
    for tensor in reader.tensors:
        name = hf_name(tensor.name)
        if name is None:
            continue
        weight = torch.from_numpy(dequantize_tensor(tensor))
        if permuted and ".self_attn.q_proj." in name:
            weight = unpermute_rotary(weight, config.num_heads)
        elif permuted and ".self_attn.k_proj." in name:
            weight = unpermute_rotary(weight, config.num_kv_heads)
        state[name] = weight.contiguous()
    if "model.embed_tokens.weight" not in state:
        raise ValueError("GGUF file has no token_embd.weight tensor")
    return state


def load_gguf(path: str | os.PathLike[str]) -> tuple[LlamaConfig, dict[str, torch.Tensor], Any]:
    """Config, fp32 HF-named weights and the open reader (for tokenizer metadata) of a GGUF file."""
    reader = open_gguf(path)
    config = LlamaConfig.from_gguf_metadata(reader)
    return config, load_gguf_state_dict(reader, config), reader


def raw_rows(tensor: Any) -> torch.Tensor:
    """The bytes of a GGUF matrix as uint8 ``[rows, row_bytes]`` (a copy out of the mmap)."""
    rows = 1
    for d in tensor.shape[1:]:
        rows *= int(d)
    raw = np.ascontiguousarray(tensor.data).view(np.uint8).reshape(rows, -1)
    return torch.from_numpy(raw.copy())


def load_gguf_blocks(
    reader: Any, config: LlamaConfig
) -> tuple[dict[str, torch.Tensor], dict[str, QuantWeight]]:
    """Every used tensor of a GGUF file under HF names, matrices kept in their file format.

    Returns ``(floats, blocks)``: ``blocks`` holds each 2-d weight stored in a format
    :mod:`deepinfer_kernels.quant` runs (Q4_0, Q4_1, Q8_0, Q4_K, Q5_K, Q6_K, F16, BF16) as its
    raw bytes; ``floats`` holds the rest as fp32 (norms, biases, F32 matrices, and matrices in
    other formats dequantised by ``gguf`` itself). Q/K rows are un-permuted on the bytes (rows
    are independent in every block format), as :func:`load_gguf_state_dict` does on floats.
    """
    arch_field = reader.fields.get("general.architecture")
    permuted = arch_field is None or arch_field.contents() == "llama"
    floats: dict[str, torch.Tensor] = {}
    blocks: dict[str, QuantWeight] = {}
    for tensor in reader.tensors:
        name = hf_name(tensor.name)
        if name is None:
            continue
        heads = None
        if permuted and ".self_attn.q_proj." in name:
            heads = config.num_heads
        elif permuted and ".self_attn.k_proj." in name:
            heads = config.num_kv_heads
        kind = int(tensor.tensor_type)
        if len(tensor.shape) == 2 and kind in _BLOCK_TYPES:
            data = raw_rows(tensor)
            if heads is not None and name.endswith(".weight"):
                data = unpermute_rotary(data, heads).contiguous()
            blocks[name] = QuantWeight(data, QuantType(kind), int(tensor.shape[0]))
            continue
        weight = torch.from_numpy(dequantize_tensor(tensor))
        if heads is not None:
            weight = unpermute_rotary(weight, heads)
        floats[name] = weight.contiguous()
    if "model.embed_tokens.weight" not in floats and "model.embed_tokens.weight" not in blocks:
        raise ValueError("GGUF file has no token_embd.weight tensor")
    return floats, blocks
