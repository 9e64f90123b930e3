"""Prefill -> decode pairing: the least-loaded decode instance that has KV room."""

from __future__ import annotations

from collections.abc import Sequence

from deepinfer_sched.policies.base import InstanceView, RequestView

__all__ = ["LeastLoadedPairing"]


class LeastLoadedPairing:
    """Among candidates with ``kv_capacity - kv_used >= kv_tokens`` (plus ``headroom`` x
    capacity kept free for the growth of running sequences), the one with the least used KV;
    ties go to fewer running sequences, then the lower position. None if nobody has room."""

    __slots__ = ("headroom",)

    def __init__(self, headroom: float = 0.0) -> None:
        if not 0.0 <= headroom < 1.0:
            raise ValueError(f"headroom must be in [0, 1), got {headroom}")
        self.headroom = headroom

    def pick(
        self, request: RequestView, candidates: Sequence[InstanceView], kv_tokens: int
    ) -> InstanceView | None:
        best: InstanceView | None = None
        best_key: tuple[int, int] | None = None
        for inst in candidates:
            cap = inst.kv_capacity_tokens
            free = cap - inst.kv_used_tokens - int(self.headroom * cap)
            if free < kv_tokens:
                continue
            key = (inst.kv_used_tokens, inst.num_running)
            if best_key is None or key < best_key:
                best, best_key = inst, key
        return best
