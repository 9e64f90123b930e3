"""Tiny random Llama GGUF files whose matrices are in chosen GGUF block formats."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from model_helpers import tiny_config, write_tiny_gguf

from deepinfer.models import LlamaConfig
from deepinfer.models.gguf_loader import permute_rotary


def quant_config(**overrides: object) -> LlamaConfig:
    """A tiny Llama whose widths are whole K-quant super-blocks (256)."""
    base: dict[str, object] = {"hidden_size": 256, "intermediate_size": 512, "num_heads": 4,
                               "num_kv_heads": 2}  # fmt: skip
    base.update(overrides)
    return tiny_config(**base)


def block_bytes(qtype: str, rows: int, cols: int, std: float, seed: int) -> np.ndarray:
    """uint8 ``[rows, row_bytes]`` of a matrix of about ``std`` in format ``qtype``: the
    ``gguf`` package's own quantiser where it has one (Q4_0, Q4_1, Q8_0), else random codes
    with scales chosen so the values are centred near zero with about that spread."""
    import gguf

    kind = gguf.GGMLQuantizationType[qtype]
    rng = np.random.default_rng(seed)
    if qtype in ("F16", "BF16"):
        values = torch.from_numpy((rng.standard_normal((rows, cols)) * std).astype(np.float32))
        dtype = torch.float16 if qtype == "F16" else torch.bfloat16
        return values.to(dtype).view(torch.uint8).numpy()
    if qtype in ("Q4_0", "Q4_1", "Q8_0"):
        values = (rng.standard_normal((rows, cols)) * std).astype(np.float32)
        return np.asarray(gguf.quants.quantize(values, kind))
    block, size = gguf.GGML_QUANT_SIZES[kind]
    raw = rng.integers(0, 256, (rows, cols // block, size), dtype=np.uint8)

    def put(offset: int, value: np.ndarray) -> None:
        raw[:, :, offset : offset + 2] = (
            value.astype(np.float16).view(np.uint8).reshape(rows, cols // block, 2)
        )

    d = std * (0.5 + rng.random((rows, cols // block)))
    if qtype == "Q6_K":  # codes and scales are signed: centred already
        put(208, d / 600)
    else:  # Q4_K / Q5_K: value = d*sc*q - dmin*m, sc and m uniform in [0, 64)
        centre = 7.5 if qtype == "Q4_K" else 15.5
        put(0, d / 250)
        put(2, d / 250 * centre)
    return raw.reshape(rows, -1)


def write_quant_gguf(path: Path, config: LlamaConfig, types: dict[str, str], seed: int = 0) -> Path:
    """A GGUF file for ``config`` with random weights; ``types`` maps a GGUF tensor role
    (``attn_q``, ``attn_k``, ``attn_v``, ``attn_output``, ``ffn_gate``, ``ffn_up``, ``ffn_down``,
    ``token_embd``, ``output``) to a GGML type name (default F32)."""
    import gguf

    state = {}  # float tensors go through the shared writer
    blocks: dict[str, tuple[np.ndarray, str]] = {}
    h, i = config.hidden_size, config.intermediate_size
    q, kv = config.q_size, config.kv_size
    shapes = {"attn_q": (q, h), "attn_k": (kv, h), "attn_v": (kv, h), "attn_output": (h, q),
              "ffn_gate": (i, h), "ffn_up": (i, h), "ffn_down": (h, i)}  # fmt: skip
    hf = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
          "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
          "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}  # fmt: skip
    g = torch.Generator().manual_seed(seed)
    n = 0
    for layer in range(config.num_layers):
        for role, (rows, cols) in shapes.items():
            name = f"model.layers.{layer}.{hf[role]}.weight"
            n += 1
            kind = types.get(role, "F32")
            if kind == "F32":
                state[name] = torch.randn(rows, cols, generator=g) * cols**-0.5
                continue
            raw = block_bytes(kind, rows, cols, cols**-0.5, seed * 1000 + n)
            if role in ("attn_q", "attn_k"):
                heads = config.num_heads if role == "attn_q" else config.num_kv_heads
                raw = permute_rotary(torch.from_numpy(raw), heads).numpy()
            blocks[f"blk.{layer}.{role}.weight"] = (np.ascontiguousarray(raw), kind)
        for norm in ("input_layernorm", "post_attention_layernorm"):
            state[f"model.layers.{layer}.{norm}.weight"] = 1 + 0.1 * torch.randn(h, generator=g)
    state["model.norm.weight"] = 1 + 0.1 * torch.randn(h, generator=g)
    for role, name in (("token_embd", "model.embed_tokens.weight"), ("output", "lm_head.weight")):
        if role == "output" and config.tie_word_embeddings:
            continue
        kind = types.get(role, "F32")
        if kind == "F32":
            state[name] = torch.randn(config.vocab_size, h, generator=g)
        else:
            raw = block_bytes(kind, config.vocab_size, h, 1.0, seed * 1000 + 900 + len(name))
            blocks[f"{role}.weight"] = (raw, kind)
    return write_tiny_gguf(path, config, state, extra_raw={
        name: (raw, gguf.GGMLQuantizationType[kind]) for name, (raw, kind) in blocks.items()
    })  # fmt: skip
