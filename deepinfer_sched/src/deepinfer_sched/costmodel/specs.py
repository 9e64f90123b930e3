"""Hardware and model descriptions, loaded from JSON data files (shipped or user-supplied)."""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, fields
from importlib import resources
from pathlib import Path
from typing import Any, TypeVar

__all__ = [
    "HardwareSpec",
    "ModelSpec",
    "available_hardware",
    "available_models",
    "load_hardware",
    "load_model",
]


def _positive(obj: object, *names: str) -> None:
    for name in names:
        v = getattr(obj, name)
        if (
            isinstance(v, bool)
            or not isinstance(v, (int, float))
            or not (v > 0 and math.isfinite(v))
        ):
            raise ValueError(f"{type(obj).__name__}.{name} must be a finite number > 0, got {v!r}")


@dataclass(frozen=True)
class HardwareSpec:
    """One accelerator (per-GPU figures; an instance of ``g`` GPUs multiplies them by ``g``).

    Units: FLOP/s, bytes/s, bytes, seconds. ``link_bandwidth`` is the GPU's share of the
    RDMA fabric used for prefill -> decode KV transfer; ``ssd_bandwidth`` its share of the
    read bandwidth from the shared SSD KV tier.
    """

    name: str
    peak_flops: float
    hbm_bandwidth: float
    hbm_capacity_bytes: float
    link_bandwidth: float
    link_latency_s: float = 0.0
    nvlink_bandwidth: float = 0.0
    ssd_bandwidth: float = 5e9
    ssd_latency_s: float = 0.0
    description: str = ""

    def __post_init__(self) -> None:
        _positive(
            self,
            "peak_flops",
            "hbm_bandwidth",
            "hbm_capacity_bytes",
            "link_bandwidth",
            "ssd_bandwidth",
        )
        for name in ("link_latency_s", "nvlink_bandwidth", "ssd_latency_s"):
            v = getattr(self, name)
            if not (v >= 0 and math.isfinite(v)):
                raise ValueError(f"HardwareSpec.{name} must be finite and >= 0, got {v!r}")


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer, enough of it for a roofline.

    ``attention``: ``"mha"``/``"gqa"`` cache ``2 * num_kv_heads * head_dim`` elements per
    token per layer; ``"mla"`` caches the compressed latent ``kv_lora_rank +
    qk_rope_head_dim``. ``qk_head_dim``/``v_head_dim`` are the per-head widths of the score
    and value products (they size the attention FLOPs). For a MoE, ``expert_params`` is the
    total of all routed experts, of which ``experts_per_token / num_experts`` is active per
    token; ``active_params`` must match ``total - expert + expert * k / E`` within 5%.
    """

    name: str
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    total_params: float
    active_params: float
    attention: str = "gqa"
    qk_head_dim: int = 0
    v_head_dim: int = 0
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    num_experts: int = 0
    experts_per_token: int = 0
    expert_params: float = 0.0
    weight_bytes_per_param: float = 2.0
    kv_bytes_per_element: int = 2
    max_context: int = 131_072
    description: str = ""

    def __post_init__(self) -> None:
        _positive(
            self,
            "num_layers",
            "hidden_size",
            "num_attention_heads",
            "num_kv_heads",
            "head_dim",
            "total_params",
            "active_params",
            "weight_bytes_per_param",
            "kv_bytes_per_element",
            "max_context",
        )
        if self.attention not in ("mha", "gqa", "mla"):
            raise ValueError(
                f"ModelSpec.attention must be 'mha', 'gqa' or 'mla', got {self.attention!r}"
            )
        if self.attention == "mla":
            _positive(self, "kv_lora_rank", "qk_rope_head_dim")
        if self.qk_head_dim == 0:
            object.__setattr__(self, "qk_head_dim", self.head_dim)
        if self.v_head_dim == 0:
            object.__setattr__(self, "v_head_dim", self.head_dim)
        if self.active_params > self.total_params:
            raise ValueError(
                f"ModelSpec.active_params ({self.active_params:g}) must be <= "
                f"total_params ({self.total_params:g})"
            )
        if self.is_moe:
            _positive(self, "experts_per_token", "expert_params")
            if self.experts_per_token > self.num_experts or self.expert_params > self.total_params:
                raise ValueError(
                    "ModelSpec: need experts_per_token <= num_experts and "
                    "expert_params <= total_params"
                )
            implied = self.params_touched(1)
            if abs(implied - self.active_params) > 0.05 * self.active_params:
                raise ValueError(
                    f"ModelSpec.active_params {self.active_params:g} disagrees with the expert "
                    f"layout, which implies {implied:g} (total - expert + expert * k / E)"
                )

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def kv_elements_per_token(self) -> int:
        """Cached elements per token over all layers (see the class doc for the per-layer count)."""
        if self.attention == "mla":
            per_layer = self.kv_lora_rank + self.qk_rope_head_dim
        else:
            per_layer = 2 * self.num_kv_heads * self.head_dim
        return self.num_layers * per_layer

    @property
    def kv_bytes_per_token(self) -> int:
        """``kv_elements_per_token * kv_bytes_per_element``."""
        return self.kv_elements_per_token * self.kv_bytes_per_element

    def params_touched(self, batch_size: int) -> float:
        """Expected parameters read by one decode step over ``batch_size`` tokens.

        Dense: ``total``. MoE: ``(total - expert) + expert * (1 - (1 - k/E)^B)``, the expected
        fraction of routed experts hit by at least one of ``B`` uniformly routed tokens.
        """
        if not self.is_moe:
            return self.total_params
        miss = (1.0 - self.experts_per_token / self.num_experts) ** max(batch_size, 1)
        return (self.total_params - self.expert_params) + self.expert_params * (1.0 - miss)


_T = TypeVar("_T", HardwareSpec, ModelSpec)


def _names(folder: str) -> list[str]:
    root = resources.files("deepinfer_sched").joinpath("data", folder)
    return sorted(p.name[:-5] for p in root.iterdir() if p.name.endswith(".json"))


def available_hardware() -> list[str]:
    """Names of the shipped hardware files (``data/hardware/*.json``)."""
    return _names("hardware")


def available_models() -> list[str]:
    """Names of the shipped model files (``data/models/*.json``)."""
    return _names("models")


def _load(cls: type[_T], folder: str, name: str | os.PathLike[str]) -> _T:
    shipped = _names(folder)
    if isinstance(name, str) and name in shipped:
        text = resources.files("deepinfer_sched").joinpath("data", folder, name + ".json")
        source = f"shipped {folder}/{name}.json"
        raw = text.read_text(encoding="utf-8")
    else:
        path = Path(name)
        if not path.is_file():
            raise ValueError(
                f"{folder} {str(name)!r} is neither a shipped name {shipped} nor "
                "an existing JSON file"
            )
        source = str(path)
        raw = path.read_text(encoding="utf-8")
    try:
        data: Any = json.loads(raw)
    except json.JSONDecodeError as e:
        raise ValueError(f"{source}: invalid JSON: {e}") from e
    if not isinstance(data, dict):
        raise ValueError(f"{source}: expected a JSON object")
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError(f"{source}: unknown keys {unknown}; allowed: {sorted(known)}")
    try:
        return cls(**data)
    except TypeError as e:
        raise ValueError(f"{source}: {e}") from e


def load_hardware(name: str | os.PathLike[str]) -> HardwareSpec:
    """A shipped hardware spec by name (``"h800"``, ``"h200"``) or one from a JSON path."""
    return _load(HardwareSpec, "hardware", name)


def load_model(name: str | os.PathLike[str]) -> ModelSpec:
    """A shipped model spec by name (``"dense-8b"``, ``"dense-70b"``, ``"deepseek-v3"``) or a
    JSON path."""
    return _load(ModelSpec, "models", name)
