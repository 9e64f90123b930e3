"""`LlamaConfig`: the shape of a Llama-family decoder (Llama, SmolLM2, Qwen2, Qwen3, Mistral).

One concept per module: this one holds the config and its conversions; `rope_scaling` the RoPE
scaling it carries, `hf_config` what a ``config.json`` may ask for and how its keys are read,
`gguf_fields` the same for a GGUF file's metadata and tensors.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from deepinfer.models.gguf_fields import (
    GGUF_GLOBAL_TENSORS,
    GGUF_LAYER_TENSORS,
    check_gguf_tensors,
    gguf_metadata,
)
from deepinfer.models.gguf_fields import f32_decimal as _f32
from deepinfer.models.hf_config import (
    ARCHITECTURE_OF,
    SUPPORTED_ACTIVATIONS,
    SUPPORTED_ARCHITECTURES,
    SUPPORTED_MODEL_TYPES,
    check_hf_config,
    hf_eos_ids,
    hf_layer_windows,
    hf_model_type,
    hf_rope_scaling,
    hf_rope_theta,
)
from deepinfer.models.rope_scaling import ROPE_SCALING_TYPES, RopeScaling, yarn_mscale
from deepinfer.models.rope_scaling import rope_scaling_from_dict as _rope_scaling_from_dict

# Everything this module held before the split stays importable from here.
__all__ = [
    "ARCHITECTURE_OF",
    "GGUF_GLOBAL_TENSORS",
    "GGUF_LAYER_TENSORS",
    "ROPE_SCALING_TYPES",
    "SUPPORTED_ACTIVATIONS",
    "SUPPORTED_ARCHITECTURES",
    "SUPPORTED_MODEL_TYPES",
    "LlamaConfig",
    "RopeScaling",
    "check_gguf_tensors",
    "check_hf_config",
    "gguf_metadata",
    "hf_eos_ids",
    "hf_layer_windows",
    "hf_model_type",
    "hf_rope_scaling",
    "hf_rope_theta",
    "yarn_mscale",
]


def _positive(name: str, value: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"{name} must be a positive int, got {value!r}")


@dataclass(frozen=True)
class LlamaConfig:
    """Hyper-parameters of a Llama-family decoder.

    Example::

        cfg = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128,
                          num_layers=2, num_heads=4, num_kv_heads=2)
        assert cfg.head_dim == 16
    """

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int = 0  # 0 means hidden_size // num_heads
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling | None = None
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = True
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = field(default_factory=tuple)
    attention_bias: bool = False  # Qwen2 has biases on q/k/v
    qk_norm: bool = False  # Qwen3: RMSNorm over each head of q and k before the rotation
    # Per-layer sliding window (0: full attention); empty when no layer slides (Mistral: all).
    layer_windows: tuple[int, ...] = ()
    model_type: str = "llama"  # the Hugging Face family the checkpoint came from
    MODEL_TYPES: ClassVar[tuple[str, ...]] = ("llama", "qwen2", "qwen3", "mistral")

    def __post_init__(self) -> None:
        for name in (
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_layers",
            "num_heads",
            "num_kv_heads",
            "max_position_embeddings",
        ):
            _positive(name, getattr(self, name))
        if self.head_dim == 0:
            if self.hidden_size % self.num_heads:
                raise ValueError(
                    f"hidden_size ({self.hidden_size}) must be divisible by num_heads "
                    f"({self.num_heads}) when head_dim is not given"
                )
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_heads)
        _positive("head_dim", self.head_dim)
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even for rotary embeddings, got {self.head_dim}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads "
                f"({self.num_kv_heads})"
            )
        if not (self.rms_norm_eps > 0 and math.isfinite(self.rms_norm_eps)):
            raise ValueError(f"rms_norm_eps must be positive, got {self.rms_norm_eps}")
        if not (self.rope_theta > 0 and math.isfinite(self.rope_theta)):
            raise ValueError(f"rope_theta must be positive, got {self.rope_theta}")
        if isinstance(self.rope_scaling, Mapping):
            object.__setattr__(self, "rope_scaling", _rope_scaling_from_dict(self.rope_scaling))
        factors = None if self.rope_scaling is None else self.rope_scaling.factors
        if factors is not None and len(factors) != self.head_dim // 2:
            raise ValueError(
                f"rope_scaling.factors must hold head_dim / 2 = {self.head_dim // 2} values, "
                f"got {len(factors)}"
            )
        windows = tuple(int(w) for w in self.layer_windows)
        if windows and (len(windows) != self.num_layers or min(windows) < 0):
            raise ValueError(
                f"layer_windows must hold num_layers = {self.num_layers} values >= 0, got "
                f"{list(windows)}"
            )
        object.__setattr__(self, "layer_windows", windows if any(windows) else ())
        if self.model_type not in self.MODEL_TYPES:
            raise ValueError(
                f"model_type {self.model_type!r} is not supported here (supported: "
                f"{', '.join(self.MODEL_TYPES)})"
            )
        eos = self.eos_token_ids
        if isinstance(eos, int):
            eos = (eos,)
        object.__setattr__(self, "eos_token_ids", tuple(int(e) for e in eos))
        for tid in (
            *self.eos_token_ids,
            *(() if self.bos_token_id is None else (self.bos_token_id,)),
        ):
            if not 0 <= tid < self.vocab_size:
                raise ValueError(f"special token id {tid} is outside [0, vocab_size)")

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    def window_of(self, layer: int) -> int:
        """Layer ``layer``'s sliding window (0: it attends over the whole context)."""
        return self.layer_windows[layer] if self.layer_windows else 0

    def kv_page_layout(self) -> tuple[int, int, int]:
        """``(planes, heads, width)`` of one token's KV in one layer: K and V planes of
        ``num_kv_heads x head_dim``."""
        return 2, self.num_kv_heads, self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    # ------------------------------------------------------------------ HF config.json
    @classmethod
    def from_hf_config(cls, cfg: Mapping[str, Any]) -> LlamaConfig:
        """Build from a Hugging Face ``config.json`` dict (LlamaForCausalLM / Qwen2ForCausalLM,
        and Mistral without a sliding window). Anything the model does not implement (another
        ``model_type``, activation, rope scaling type, a sliding window, quantization) raises a
        ``ValueError`` naming it rather than loading a model that computes something else."""
        check_hf_config(cfg)
        try:
            hidden = int(cfg["hidden_size"])
            heads = int(cfg["num_attention_heads"])
            model_type = hf_model_type(cfg)
            return cls(
                vocab_size=int(cfg["vocab_size"]),
                hidden_size=hidden,
                intermediate_size=int(cfg["intermediate_size"]),
                num_layers=int(cfg["num_hidden_layers"]),
                num_heads=heads,
                num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
                head_dim=int(cfg.get("head_dim") or hidden // heads),
                rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-5)),
                rope_theta=hf_rope_theta(cfg),
                rope_scaling=_rope_scaling_from_dict(hf_rope_scaling(cfg)),
                max_position_embeddings=int(cfg.get("max_position_embeddings", 2048)),
                tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
                bos_token_id=cfg.get("bos_token_id"),
                eos_token_ids=hf_eos_ids(cfg),
                attention_bias=bool(cfg.get("attention_bias", model_type == "qwen2")),
                qk_norm=model_type == "qwen3",
                layer_windows=hf_layer_windows(cfg, model_type),
                model_type=model_type,
            )
        except KeyError as exc:
            raise ValueError(f"config.json is missing required key {exc.args[0]!r}") from exc

    def to_hf_config(self) -> dict[str, Any]:
        """The ``config.json`` dict a Hugging Face ``LlamaForCausalLM`` would load."""
        eos: int | list[int] | None
        eos = (
            None
            if not self.eos_token_ids
            else self.eos_token_ids[0]
            if len(self.eos_token_ids) == 1
            else list(self.eos_token_ids)
        )
        windows = set(self.layer_windows) - {0}
        window = max(windows) if windows else None
        slide: dict[str, Any] = {}
        if self.model_type == "mistral":
            slide = {"sliding_window": window}
        elif window is not None:
            slide = {
                "use_sliding_window": True,
                "sliding_window": window,
                "max_window_layers": self.num_layers,
                "layer_types": [
                    "sliding_attention" if w else "full_attention" for w in self.layer_windows
                ],
            }
        return {
            "architectures": [ARCHITECTURE_OF.get(self.model_type, self.model_type)],
            "model_type": self.model_type,
            **slide,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_scaling": None if self.rope_scaling is None else self.rope_scaling.to_hf(),
            "max_position_embeddings": self.max_position_embeddings,
            "tie_word_embeddings": self.tie_word_embeddings,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": eos,
            "attention_bias": self.attention_bias,
            "mlp_bias": False,
            "torch_dtype": "bfloat16",
        }

    # ------------------------------------------------------------------ GGUF metadata
    @classmethod
    def from_gguf_metadata(cls, reader: Any) -> LlamaConfig:
        """Build from the key/value metadata of a ``gguf.GGUFReader`` (llama architecture)."""
        meta = gguf_metadata(reader)
        arch = meta.get("general.architecture", "llama")
        if arch not in ("llama", "qwen2"):
            raise ValueError(f"GGUF architecture must be llama or qwen2, got {arch!r}")

        def get(key: str, default: Any = None) -> Any:
            value = meta.get(f"{arch}.{key}", default)
            if value is None:
                raise ValueError(f"GGUF metadata is missing {arch}.{key}")
            return value

        heads = int(get("attention.head_count"))
        hidden = int(get("embedding_length"))
        names = {t.name for t in reader.tensors}
        vocab = meta.get(f"{arch}.vocab_size")
        if vocab is None and "tokenizer.ggml.tokens" in reader.fields:
            vocab = len(reader.fields["tokenizer.ggml.tokens"].data)
        if vocab is None:
            raise ValueError("GGUF metadata has neither a vocab_size nor tokenizer tokens")
        eos = meta.get("tokenizer.ggml.eos_token_id")
        scaling = None
        scaling_type = meta.get(f"{arch}.rope.scaling.type")
        if scaling_type not in (None, "none"):
            raise ValueError(
                f"GGUF {arch}.rope.scaling.type {scaling_type!r} is not supported (only none, "
                "or Llama-3 scaling stored as a rope_freqs tensor)"
            )
        sliding = meta.get(f"{arch}.attention.sliding_window")
        if sliding:
            raise ValueError(
                f"GGUF {arch}.attention.sliding_window = {sliding} is not supported: attention "
                "here is over the full context"
            )
        check_gguf_tensors(names)
        if "rope_freqs.weight" in names:
            # llama.cpp stores Llama-3.1/3.2 scaling as the per-frequency divisors themselves.
            tensor = next(t for t in reader.tensors if t.name == "rope_freqs.weight")
            values = np.asarray(tensor.data, dtype=np.float32).reshape(-1)
            scaling = RopeScaling(rope_type="factors", factors=tuple(float(x) for x in values))
        return cls(
            vocab_size=int(vocab),
            hidden_size=hidden,
            intermediate_size=int(get("feed_forward_length")),
            num_layers=int(get("block_count")),
            num_heads=heads,
            num_kv_heads=int(get("attention.head_count_kv", heads)),
            head_dim=int(meta.get(f"{arch}.attention.key_length", hidden // heads)),
            rms_norm_eps=_f32(get("attention.layer_norm_rms_epsilon", 1e-5)),
            rope_theta=_f32(get("rope.freq_base", 10000.0)),
            rope_scaling=scaling,
            max_position_embeddings=int(get("context_length", 2048)),
            tie_word_embeddings="output.weight" not in names,
            bos_token_id=meta.get("tokenizer.ggml.bos_token_id"),
            eos_token_ids=() if eos is None else (int(eos),),
            attention_bias="blk.0.attn_q.bias" in names,
        )

    def replace(self, **changes: Any) -> LlamaConfig:
        return dataclasses.replace(self, **changes)
