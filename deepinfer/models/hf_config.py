"""Reading a Hugging Face ``config.json`` for the Llama family: what `LlamaModel` implements
(anything else is refused by name), and the keys that moved between transformers versions."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

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
