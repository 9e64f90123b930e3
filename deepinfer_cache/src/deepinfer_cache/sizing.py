"""KV bytes per token of reference models and SSD sizing for a prefix cache.

Bytes per token:

* standard attention (MHA/GQA): ``2 (K and V) x layers x kv_heads x head_dim x dtype_bytes``
  (Llama-3-8B: 2 x 32 x 8 x 128 x 2 = 131072 B = 128 KiB in bf16);
* MLA (DeepSeek-V3): one compressed latent plus the decoupled RoPE key per layer,
  ``(kv_lora_rank + rope_dim) x layers x dtype_bytes`` = (512 + 64) x 61 x 2 = 70272 B.

SSD capacity: tokens that miss are computed and stored, and live for their class's retention::

    stored_tokens_per_day = input_tokens_per_day x (1 - hit_rate)
    capacity = stored_tokens_per_day x bytes_per_token
               x (chat_fraction x chat_days + (1 - chat_fraction) x agent_days) x (1 + overhead)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from types import MappingProxyType
from typing import Any


@dataclass(frozen=True)
class ModelKV:
    """KV geometry of a model. Set ``mla_latent`` (and ``mla_rope``) for MLA models."""

    name: str
    num_layers: int
    num_kv_heads: int = 0
    head_dim: int = 0
    dtype_bytes: int = 2
    mla_latent: int = 0
    mla_rope: int = 0

    def __post_init__(self) -> None:
        if self.num_layers <= 0 or self.dtype_bytes <= 0:
            raise ValueError("num_layers and dtype_bytes must be positive")
        if self.mla_latent <= 0 and (self.num_kv_heads <= 0 or self.head_dim <= 0):
            raise ValueError("give num_kv_heads and head_dim, or mla_latent for MLA")

    @property
    def bytes_per_token(self) -> int:
        if self.mla_latent > 0:
            return (self.mla_latent + self.mla_rope) * self.num_layers * self.dtype_bytes
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.dtype_bytes


REFERENCE_MODELS: Mapping[str, ModelKV] = MappingProxyType(
    {
        m.name: m
        for m in (
            ModelKV("llama-3-8b", 32, 8, 128),
            ModelKV("llama-3-70b", 80, 8, 128),
            ModelKV("qwen2.5-7b", 28, 4, 128),
            ModelKV("smollm2-135m", 30, 3, 64),
            ModelKV("deepseek-v3", 61, mla_latent=512, mla_rope=64),
        )
    }
)


@dataclass(frozen=True)
class SizingResult:
    bytes_per_token: int
    stored_tokens_per_day: float
    write_bytes_per_day: float
    write_bandwidth: float  # bytes/s, averaged over the day
    read_bandwidth: float  # bytes/s if every hit is served from SSD
    mean_retention_days: float
    capacity_bytes: float

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def ssd_capacity(
    bytes_per_token: int,
    *,
    input_tokens_per_day: float | None = None,
    tokens_per_second: float | None = None,
    hit_rate: float = 0.96,
    chat_fraction: float = 0.5,
    chat_days: float = 7.0,
    agent_days: float = 3.0,
    overhead: float = 0.05,
) -> SizingResult:
    """SSD capacity and bandwidth for a prefix cache (formula in the module docstring).

    Give the input-token rate either per day or per second.

    >>> r = ssd_capacity(131072, tokens_per_second=1e5, hit_rate=0.9, chat_fraction=1.0)
    >>> round(r.capacity_bytes / 1e12, 1)  # TB
    832.4
    """
    if (input_tokens_per_day is None) == (tokens_per_second is None):
        raise ValueError("give exactly one of input_tokens_per_day and tokens_per_second")
    if input_tokens_per_day is not None:
        per_day = float(input_tokens_per_day)
    else:
        per_day = float(tokens_per_second or 0.0) * 86400.0
    if bytes_per_token <= 0 or per_day < 0:
        raise ValueError("bytes_per_token must be > 0 and the token rate >= 0")
    if not 0.0 <= hit_rate <= 1.0 or not 0.0 <= chat_fraction <= 1.0:
        raise ValueError("hit_rate and chat_fraction must be in [0, 1]")
    if chat_days < 0 or agent_days < 0 or overhead < 0:
        raise ValueError("chat_days, agent_days and overhead must be >= 0")
    stored = per_day * (1.0 - hit_rate)
    days = chat_fraction * chat_days + (1.0 - chat_fraction) * agent_days
    write = stored * bytes_per_token
    return SizingResult(
        bytes_per_token=bytes_per_token,
        stored_tokens_per_day=stored,
        write_bytes_per_day=write,
        write_bandwidth=write / 86400.0,
        read_bandwidth=per_day * hit_rate * bytes_per_token / 86400.0,
        mean_retention_days=days,
        capacity_bytes=write * days * (1.0 + overhead),
    )
