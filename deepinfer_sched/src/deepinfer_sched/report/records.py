"""Per-request outcomes and the service-level objective they are judged against."""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["SLO", "RequestRecord"]


@dataclass(frozen=True)
class SLO:
    """Targets: time to first token ``ttft_s`` and mean time per output token ``tpot_s``."""

    ttft_s: float
    tpot_s: float

    def __post_init__(self) -> None:
        for name in ("ttft_s", "tpot_s"):
            v = getattr(self, name)
            if not (v > 0.0 and math.isfinite(v)):
                raise ValueError(f"SLO.{name} must be finite and > 0, got {v}")


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """What happened to one request in a simulation (times in seconds since trace start).

    For a rejected request ``first_token_s``/``finish_s`` are NaN and the instances -1.
    ``cached_tokens`` counts input tokens served from a prefix cache (any tier).
    """

    request_id: int
    arrival_s: float
    first_token_s: float
    finish_s: float
    input_len: int
    output_len: int
    cached_tokens: int
    rejected: bool
    prefill_instance: int
    decode_instance: int
    tenant: str = "default"

    def __post_init__(self) -> None:
        if not 0 <= self.cached_tokens <= self.input_len:
            raise ValueError(
                f"request {self.request_id}: cached_tokens must be in [0, input_len="
                f"{self.input_len}], got {self.cached_tokens}"
            )
        if self.output_len < 1:
            raise ValueError(f"request {self.request_id}: output_len must be >= 1")
        if not self.rejected and not (
            self.arrival_s <= self.first_token_s <= self.finish_s and math.isfinite(self.finish_s)
        ):
            raise ValueError(
                f"request {self.request_id}: need arrival_s <= first_token_s <= finish_s "
                f"(finite), got {self.arrival_s}, {self.first_token_s}, {self.finish_s}"
            )

    @property
    def ttft_s(self) -> float:
        """``first_token_s - arrival_s`` (NaN when rejected)."""
        return self.first_token_s - self.arrival_s if not self.rejected else math.nan

    @property
    def tpot_s(self) -> float:
        """``(finish_s - first_token_s) / (output_len - 1)``; 0 for a one-token output."""
        if self.rejected:
            return math.nan
        if self.output_len <= 1:
            return 0.0
        return (self.finish_s - self.first_token_s) / (self.output_len - 1)

    @property
    def e2e_s(self) -> float:
        """``finish_s - arrival_s`` (NaN when rejected)."""
        return self.finish_s - self.arrival_s if not self.rejected else math.nan

    def meets(self, slo: SLO) -> bool:
        """Completed, with TTFT <= ``slo.ttft_s`` and TPOT <= ``slo.tpot_s``."""
        return (not self.rejected) and self.ttft_s <= slo.ttft_s and self.tpot_s <= slo.tpot_s
