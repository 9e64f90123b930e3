"""The cost-model seam the simulator and the latency-aware policies depend on."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

__all__ = ["CostModel", "WorkParts"]


@runtime_checkable
class CostModel(Protocol):
    """Times (seconds) of the operations one serving instance performs."""

    @property
    def kv_bytes_per_token(self) -> int: ...

    def prefill_time(self, new_tokens: int, cached_tokens: int = 0) -> float: ...

    def decode_step_time(self, batch_size: int, total_context_tokens: int) -> float: ...

    def kv_transfer_time(self, num_tokens: int) -> float: ...

    def ssd_fetch_time(self, num_tokens: int) -> float: ...

    def kv_capacity_tokens(self, memory_fraction: float = 0.9) -> int: ...


@runtime_checkable
class WorkParts(Protocol):
    """Optional: how a step's time splits into compute-bound and memory-bound seconds, each
    the time the work would keep the attainable FLOP/s (or HBM bandwidth) fully busy. The
    simulator's utilisation figures use it; without it they fall back to busy time."""

    def prefill_parts(self, new_tokens: int, cached_tokens: int = 0) -> tuple[float, float]: ...

    def decode_parts(self, batch_size: int, total_context_tokens: int) -> tuple[float, float]: ...
