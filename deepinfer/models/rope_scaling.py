"""`RopeScaling`: frequency-dependent RoPE scaling (llama3, per-frequency factors, YaRN), and
reading it from a Hugging Face ``rope_scaling`` dict."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

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


def rope_scaling_from_dict(raw: Any) -> RopeScaling | None:
    """A `RopeScaling` from a ``rope_scaling`` dict (``None`` when it scales nothing)."""
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
