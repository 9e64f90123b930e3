"""`LlamaConfig`: the shape of a Llama-family decoder (Llama, SmolLM2, Qwen2, Qwen3, Mistral)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

ROPE_SCALING_TYPES = ("llama3", "factors", "yarn")


@dataclass(frozen=True)
class RopeScaling:
    """Frequency-dependent RoPE scaling.

    ``llama3`` (Hugging Face's): for each inverse frequency ``f`` with wavelength
    ``w = 2*pi/f``: ``w < L/high`` keeps ``f``; ``w > L/low`` uses ``f/factor``; in between
    ``f' = (1-s) f/factor + s f`` with ``s = (L/w - low)/(high - low)``, where ``L`` is
    ``original_max_position_embeddings``.

    ``factors`` (llama.cpp's): ``f'_i = f_i / factors[i]``, one divisor per frequency, as a
    GGUF file's ``rope_freqs`` tensor stores Llama-3.1/3.2 scaling.

    ``yarn`` (YaRN, as Hugging Face computes it; DeepSeek-V2/V3, long-context Qwen): each
    frequency blends ``f/factor`` and ``f`` along a linear ramp between the correction
    dimensions of ``beta_fast`` and ``beta_slow`` rotations; cos/sin are multiplied by
    :attr:`attention_factor` (``mscale``/``mscale_all_dim`` give DeepSeek's form).
    """

    rope_type: str = "llama3"
    factor: float = 8.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192
    factors: tuple[float, ...] | None = None
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float = 0.0
    mscale_all_dim: float = 0.0
    yarn_attention_factor: float | None = None
    truncate: bool = True

    def __post_init__(self) -> None:
        if self.rope_type not in ROPE_SCALING_TYPES:
            raise ValueError(
                f"rope_scaling rope_type {self.rope_type!r} is not supported (supported: "
                f"{', '.join(ROPE_SCALING_TYPES)})"
            )
        if self.rope_type == "factors":
            if self.factors is None or not len(self.factors):
                raise ValueError("rope_scaling of type 'factors' needs the factors")
            values = tuple(float(f) for f in self.factors)
            if not all(math.isfinite(f) and f > 0 for f in values):
                raise ValueError("rope_scaling.factors must be finite and positive")
            object.__setattr__(self, "factors", values)
            return
        if self.factors is not None:
            raise ValueError(
                f"rope_scaling.factors belong to type 'factors', not {self.rope_type!r}"
            )
        if not self.factor >= 1.0:
            raise ValueError(f"rope_scaling.factor must be >= 1, got {self.factor}")
        if self.original_max_position_embeddings <= 0:
            raise ValueError("rope_scaling.original_max_position_embeddings must be positive")
        if self.rope_type == "yarn":
            if not 0 < self.beta_slow <= self.beta_fast:
                raise ValueError(
                    "rope_scaling (yarn) needs 0 < beta_slow <= beta_fast, got "
                    f"{self.beta_slow} and {self.beta_fast}"
                )
            return
        if not 0 < self.low_freq_factor < self.high_freq_factor:
            raise ValueError(
                "rope_scaling needs 0 < low_freq_factor < high_freq_factor, got "
                f"{self.low_freq_factor} and {self.high_freq_factor}"
            )
        if self.original_max_position_embeddings <= 0:
            raise ValueError("rope_scaling.original_max_position_embeddings must be positive")

    @property
    def attention_factor(self) -> float:
        """What YaRN multiplies cos and sin by (1 for the other types)."""
        if self.rope_type != "yarn":
            return 1.0
        if self.yarn_attention_factor is not None:
            return self.yarn_attention_factor
        if self.mscale and self.mscale_all_dim:
            return yarn_mscale(self.factor, self.mscale) / yarn_mscale(
                self.factor, self.mscale_all_dim
            )
        return yarn_mscale(self.factor)

    def to_hf(self) -> dict[str, Any]:
        if self.rope_type == "factors":  # not a Hugging Face type: read back by from_hf_config
            return {"rope_type": "factors", "factors": list(self.factors or ())}
        if self.rope_type == "yarn":
            out: dict[str, Any] = {
                "rope_type": "yarn",
                "factor": self.factor,
                "original_max_position_embeddings": self.original_max_position_embeddings,
                "beta_fast": self.beta_fast,
                "beta_slow": self.beta_slow,
                "truncate": self.truncate,
            }
            if self.mscale:
                out["mscale"] = self.mscale
            if self.mscale_all_dim:
                out["mscale_all_dim"] = self.mscale_all_dim
            if self.yarn_attention_factor is not None:
                out["attention_factor"] = self.yarn_attention_factor
            return out
        return {
            "rope_type": self.rope_type,
            "factor": self.factor,
            "low_freq_factor": self.low_freq_factor,
            "high_freq_factor": self.high_freq_factor,
            "original_max_position_embeddings": self.original_max_position_embeddings,
        }


def yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    """YaRN's magnitude correction ``0.1 * mscale * ln(scale) + 1`` (1 when not scaled)."""
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


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


# What `LlamaModel` (and the Qwen3 variant in qwen.py) implements; the rest is refused by name.
ARCHITECTURE_OF = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "mistral": "MistralForCausalLM",
}
SUPPORTED_MODEL_TYPES = tuple(ARCHITECTURE_OF)
SUPPORTED_ARCHITECTURES = tuple(ARCHITECTURE_OF.values())
SUPPORTED_ACTIVATIONS = ("silu", "swish")
# Per-layer GGUF tensor kinds (``blk.N.<kind>.weight|bias``) and global tensors the loader maps.
GGUF_LAYER_TENSORS = frozenset(
    {
        "attn_norm",
        "attn_q",
        "attn_k",
        "attn_v",
        "attn_output",
        "ffn_norm",
        "ffn_gate",
        "ffn_up",
        "ffn_down",
    }
)
GGUF_GLOBAL_TENSORS = frozenset(
    {"token_embd.weight", "output_norm.weight", "output.weight", "rope_freqs.weight"}
)


def check_hf_config(cfg: Mapping[str, Any]) -> None:
    """Raise ``ValueError`` naming the first setting of a ``config.json`` that `LlamaModel`
    does not implement."""
    model_type = cfg.get("model_type")
    if model_type is not None and model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(
            f"model_type {model_type!r} is not supported (supported: "
            f"{', '.join(SUPPORTED_MODEL_TYPES)})"
        )
    archs = [a for a in cfg.get("architectures") or [] if a not in SUPPORTED_ARCHITECTURES]
    if archs:
        raise ValueError(
            f"architecture {archs[0]!r} is not supported (supported: "
            f"{', '.join(SUPPORTED_ARCHITECTURES)})"
        )
    for key in ("hidden_act", "hidden_activation"):
        act = cfg.get(key)
        if act is not None and act not in SUPPORTED_ACTIVATIONS:
            raise ValueError(f"{key} {act!r} is not supported (only silu)")
    for key in ("mlp_bias",):
        if cfg.get(key):
            raise ValueError(f"{key} = true is not supported")
    if cfg.get("quantization_config") is not None:
        method = cfg["quantization_config"].get("quant_method", "?")
        raise ValueError(f"quantization_config ({method}) is not supported; use a GGUF file")
    partial = cfg.get("partial_rotary_factor", 1.0)
    if partial != 1.0:
        raise ValueError(f"partial_rotary_factor = {partial} is not supported (only 1.0)")


def hf_model_type(cfg: Mapping[str, Any]) -> str:
    """The family of a ``config.json``: its ``model_type``, else read from ``architectures``."""
    model_type = cfg.get("model_type")
    if model_type is not None:
        return str(model_type)
    known = {**ARCHITECTURE_OF, "deepseek_v2": "DeepseekV2ForCausalLM",
             "deepseek_v3": "DeepseekV3ForCausalLM"}  # fmt: skip
    for arch in cfg.get("architectures") or []:
        for kind, name in known.items():
            if arch == name:
                return kind
    return "llama"


def hf_rope_theta(cfg: Mapping[str, Any], default: float = 10000.0) -> float:
    """``rope_theta`` at the top level (transformers 4) or in ``rope_parameters`` (5)."""
    params = cfg.get("rope_parameters")
    if cfg.get("rope_theta") is not None:
        return float(cfg["rope_theta"])
    if isinstance(params, Mapping) and params.get("rope_theta") is not None:
        return float(params["rope_theta"])
    return default


def hf_rope_scaling(cfg: Mapping[str, Any]) -> Any:
    """The rope scaling dict: ``rope_scaling`` (transformers 4, model repos) or the scaling
    keys of ``rope_parameters`` (transformers 5)."""
    if cfg.get("rope_scaling") is not None:
        return cfg["rope_scaling"]
    params = cfg.get("rope_parameters")
    if isinstance(params, Mapping):
        return {k: v for k, v in params.items() if k != "rope_theta"}
    return None


def hf_eos_ids(cfg: Mapping[str, Any]) -> tuple[int, ...]:
    eos = cfg.get("eos_token_id")
    return () if eos is None else (int(eos),) if isinstance(eos, int) else tuple(eos)


def hf_layer_windows(cfg: Mapping[str, Any], model_type: str) -> tuple[int, ...]:
    """Per-layer sliding windows (0: full) as Hugging Face applies them: Mistral slides every
    layer by ``sliding_window``; Qwen2/Qwen3 only with ``use_sliding_window``, on the layers
    ``layer_types`` marks (by default those from ``max_window_layers`` on)."""
    window = cfg.get("sliding_window")
    layers = int(cfg["num_hidden_layers"])
    if window is None or (model_type != "mistral" and not cfg.get("use_sliding_window", False)):
        kinds = cfg.get("layer_types")
        if kinds and any(k != "full_attention" for k in kinds):
            raise ValueError(
                f"layer_types {sorted(set(kinds))} without a sliding_window is not supported"
            )
        return ()
    window = int(window)
    if window <= 0:
        raise ValueError(f"sliding_window must be positive, got {window}")
    kinds = cfg.get("layer_types")
    if kinds is None:
        if model_type == "mistral":
            return (window,) * layers
        first = int(cfg.get("max_window_layers", layers))
        return tuple(window if i >= first else 0 for i in range(layers))
    if len(kinds) != layers:
        raise ValueError(f"layer_types has {len(kinds)} entries for {layers} layers")
    unknown = sorted(set(kinds) - {"full_attention", "sliding_attention"})
    if unknown:
        raise ValueError(f"layer type {unknown[0]!r} is not supported")
    return tuple(window if k == "sliding_attention" else 0 for k in kinds)


def check_gguf_tensors(names: set[str] | frozenset[str]) -> None:
    """Raise ``ValueError`` naming GGUF tensors the loader would otherwise drop silently."""
    unknown = []
    for name in sorted(names):
        if name in GGUF_GLOBAL_TENSORS:
            continue
        parts = name.split(".")
        if len(parts) == 4 and parts[0] == "blk" and parts[2] in GGUF_LAYER_TENSORS:
            continue
        unknown.append(name)
    if unknown:
        raise ValueError(
            f"GGUF tensor {unknown[0]!r} is not implemented by the Llama loader "
            f"({len(unknown)} such tensors): this architecture variant is not supported"
        )


def _f32(value: Any) -> float:
    """A float32 metadata value as the shortest decimal that rounds to it (1e-05, not
    9.999999747378752e-06), which is what the original ``config.json`` held."""
    return float(str(np.float32(value)))


def _rope_scaling_from_dict(raw: Any) -> RopeScaling | None:
    if raw is None or isinstance(raw, RopeScaling):
        return raw
    if not isinstance(raw, Mapping):
        raise TypeError(f"rope_scaling must be a dict or None, got {type(raw).__name__}")
    kind = raw.get("rope_type", raw.get("type"))
    if kind in (None, "default", "none"):
        return None
    if kind == "factors":
        return RopeScaling(rope_type="factors", factors=tuple(raw.get("factors") or ()))
    if kind == "yarn":
        if raw.get("factor") is None or raw.get("original_max_position_embeddings") is None:
            raise ValueError(
                "rope_scaling (yarn) needs factor and original_max_position_embeddings"
            )
        attention = raw.get("attention_factor")
        return RopeScaling(
            rope_type="yarn",
            factor=float(raw["factor"]),
            original_max_position_embeddings=int(raw["original_max_position_embeddings"]),
            beta_fast=float(raw.get("beta_fast") or 32.0),
            beta_slow=float(raw.get("beta_slow") or 1.0),
            mscale=float(raw.get("mscale") or 0.0),
            mscale_all_dim=float(raw.get("mscale_all_dim") or 0.0),
            yarn_attention_factor=None if attention is None else float(attention),
            truncate=bool(raw.get("truncate", True)),
        )
    return RopeScaling(
        rope_type=str(kind),
        factor=float(raw.get("factor", 8.0)),
        low_freq_factor=float(raw.get("low_freq_factor", 1.0)),
        high_freq_factor=float(raw.get("high_freq_factor", 4.0)),
        original_max_position_embeddings=int(raw.get("original_max_position_embeddings", 8192)),
    )


def gguf_metadata(reader: Any, *, max_array_len: int = 256) -> dict[str, Any]:
    """GGUF key/value metadata as plain Python values.

    Arrays longer than ``max_array_len`` (the tokenizer's vocabulary and merges) are left out:
    converting them costs time and only the tokenizer needs them.
    """
    out: dict[str, Any] = {}
    for key, fld in reader.fields.items():
        if key.startswith("GGUF.") or len(fld.data) > max_array_len:
            continue
        out[key] = fld.contents()
    return out
