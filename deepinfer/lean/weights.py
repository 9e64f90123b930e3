"""A GGUF model's weights for the lean runtime: views of the engine's blocks file, one copy.

``gguf-blocks.st`` holds each projection as the GGUF file's bytes (Q/K rows un-permuted to
Hugging Face's rotary layout, QKV and gate/up joined), norms and biases as fp32: the layout
``quant_decoder_layer.c`` reads. :func:`load_weights` maps the file and wraps the arrays as
:class:`~deepinfer_kernels.cpu.BlockRows` without copying them (a projection the file stores
in parts, or as fp32 floats, is joined or taken as F32 rows).

Example::

    weights = load_weights(files.blocks)
    weights.layers[0].qkv.layout  # ((QuantType.Q4_1, 960),)
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

import numpy as np

from deepinfer.lean.safetensors_map import SafetensorsMap
from deepinfer.models.config import LlamaConfig
from deepinfer_kernels.cpu.numpy_blocks import BlockRows, LayerBlockRows, LayerDims
from deepinfer_kernels.quant.formats import QuantType, quant_type

_FUSED = (
    ("self_attn.qkv_proj", ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")),
    ("mlp.gate_up_proj", ("mlp.gate_proj", "mlp.up_proj")),
)


class UnsupportedModel(ValueError):
    """The model needs something the lean runtime does not run (it names what); the engine
    runs it."""


@dataclass(frozen=True)
class LeanWeights:
    """Everything a forward reads (see the module doc)."""

    config: LlamaConfig
    dims: LayerDims
    layers: tuple[LayerBlockRows, ...]
    input_norms: tuple[np.ndarray, ...]
    post_norms: tuple[np.ndarray, ...]
    final_norm: np.ndarray
    embed: BlockRows
    head: BlockRows

    def next_norm(self, layer: int) -> np.ndarray:
        """The norm after layer ``layer``'s MLP: the next layer's input norm, or the final."""
        return self.input_norms[layer + 1] if layer + 1 < len(self.layers) else self.final_norm

    @property
    def nbytes(self) -> int:
        """Bytes of the block-format matrices (each counted once)."""
        seen = {id(m.data): m.nbytes for layer in self.layers
                for m in (layer.qkv, layer.o, layer.gate_up, layer.down)}  # fmt: skip
        seen[id(self.embed.data)] = self.embed.nbytes
        seen[id(self.head.data)] = self.head.nbytes
        return sum(seen.values())


def check_supported(config: LlamaConfig) -> None:
    """Raise :class:`UnsupportedModel` naming the first feature of ``config`` that the lean
    runtime does not run (it runs Llama-style layers: full causal attention, plain RoPE)."""
    if config.qk_norm:
        raise UnsupportedModel("the lean runtime does not run q/k norms (Qwen3)")
    if config.layer_windows:
        raise UnsupportedModel("the lean runtime does not run sliding-window attention")
    if config.rope_scaling is not None:
        raise UnsupportedModel("the lean runtime does not run scaled RoPE (rope_scaling)")


class _Tensors:
    """The blocks file's tensors by Hugging Face name, block bytes with their format."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.st = SafetensorsMap(path)
        meta = self.st.metadata
        try:
            self.config = LlamaConfig.from_hf_config(json.loads(meta["config"]))
            self.kinds = {n: (quant_type(q), int(c)) for n, (q, c) in
                          json.loads(meta["blocks"]).items()}  # fmt: skip
            self.fused = json.loads(meta["fused"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"{os.fspath(path)!r}: unreadable blocks metadata: {exc}") from exc

    def floats(self, name: str) -> np.ndarray:
        a = self.st.array(name)
        if a.dtype != np.float32:
            raise ValueError(f"{name}: expected fp32, got {a.dtype}")
        return a

    def part(self, name: str) -> tuple[np.ndarray, QuantType, int]:
        """A matrix as ``(bytes, qtype, cols)``: block bytes, or fp32 floats as F32 rows."""
        if name in self.kinds:
            qtype, cols = self.kinds[name]
            return self.st.array(name), qtype, cols
        a = self.floats(name)
        if a.ndim != 2:
            raise ValueError(f"{name}: expected a matrix, got shape {a.shape}")
        return a.reshape(-1).view(np.uint8), QuantType.F32, int(a.shape[1])

    def matrix(self, fused: str, names: tuple[str, ...]) -> BlockRows:
        """The projection ``fused`` (stored joined) or the row-wise join of ``names``."""
        if fused in self.fused:
            layout = tuple((quant_type(q), int(r)) for _, q, r, _ in self.fused[fused])
            cols = int(self.fused[fused][0][3])
            return BlockRows(self.st.array(fused).reshape(-1), layout, cols)
        return BlockRows.of(*(self.part(n) for n in names))

    def has(self, name: str) -> bool:
        return name in self.kinds or name in self.st.names()


def load_weights(path: str | os.PathLike[str]) -> LeanWeights:
    """The weights of the blocks file ``path`` (``ValueError`` for a file that does not fit
    its config, :class:`UnsupportedModel` for a model the lean runtime does not run)."""
    t = _Tensors(path)
    cfg = t.config
    check_supported(cfg)
    dims = LayerDims(cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim,
                     cfg.intermediate_size)  # fmt: skip
    layers, input_norms, post_norms = [], [], []
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}."
        qkv_names = tuple(f"{p}{n}.weight" for n in _FUSED[0][1])
        gate_up_names = tuple(f"{p}{n}.weight" for n in _FUSED[1][1])
        biases = [f"{p}{n}.bias" for n in _FUSED[0][1]]
        present = [t.has(b) for b in biases]
        if any(present) and not all(present):
            raise ValueError(f"{p}self_attn: some of q/k/v have a bias and others not")
        bias = np.concatenate([t.floats(b) for b in biases]) if all(present) else None
        o_data, o_type, o_cols = t.part(f"{p}self_attn.o_proj.weight")
        down_data, down_type, down_cols = t.part(f"{p}mlp.down_proj.weight")
        layers.append(
            LayerBlockRows(
                dims,
                t.matrix(f"{p}{_FUSED[0][0]}.weight", qkv_names),
                bias,
                BlockRows.of((o_data, o_type, o_cols)),
                t.matrix(f"{p}{_FUSED[1][0]}.weight", gate_up_names),
                BlockRows.of((down_data, down_type, down_cols)),
            )
        )
        input_norms.append(t.floats(f"{p}input_layernorm.weight"))
        post_norms.append(t.floats(f"{p}post_attention_layernorm.weight"))
    embed = BlockRows.of(t.part("model.embed_tokens.weight"))
    head = embed
    if not cfg.tie_word_embeddings:
        head = BlockRows.of(t.part("lm_head.weight"))
    if (embed.rows, embed.cols) != (cfg.vocab_size, cfg.hidden_size):
        raise ValueError(f"model.embed_tokens.weight: expected {cfg.vocab_size}x{cfg.hidden_size}")
    if (head.rows, head.cols) != (cfg.vocab_size, cfg.hidden_size):
        raise ValueError(f"lm_head.weight: expected {cfg.vocab_size}x{cfg.hidden_size}")
    for name, norm in (("model.norm.weight", t.floats("model.norm.weight")),
                       *((f"layer norm {i}", n) for i, n in enumerate(input_norms + post_norms))):  # fmt: skip
        if norm.shape != (cfg.hidden_size,):
            raise ValueError(f"{name}: expected [{cfg.hidden_size}], got {list(norm.shape)}")
    return LeanWeights(cfg, dims, tuple(layers), tuple(input_norms), tuple(post_norms),
                       t.floats("model.norm.weight"), embed, head)  # fmt: skip
