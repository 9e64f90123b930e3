"""Prefix-affinity routing: the instance caching the longest prefix, unless it is overloaded."""

from __future__ import annotations

from collections.abc import Sequence

from deepinfer_sched.policies.base import InstanceView, RequestView
from deepinfer_sched.policies.least_loaded import outstanding

__all__ = ["PrefixAffinityRouter"]


class PrefixAffinityRouter:
    """Most locally cached prefix blocks wins, among candidates whose outstanding requests
    are at most ``load_cutoff`` x (the minimum outstanding + 1). The cut-off stops a hot
    shared prefix from pulling every request onto one instance. Ties go to lower load, then
    lower position."""

    __slots__ = ("load_cutoff",)

    def __init__(self, load_cutoff: float = 2.0) -> None:
        if not load_cutoff >= 1.0:
            raise ValueError(f"load_cutoff must be >= 1, got {load_cutoff}")
        self.load_cutoff = load_cutoff

    def route(self, request: RequestView, candidates: Sequence[InstanceView]) -> InstanceView:
        loads = [outstanding(c) for c in candidates]
        limit = self.load_cutoff * (min(loads) + 1)
        hashes = request.block_hashes
        best = candidates[0]
        best_key: tuple[int, int] | None = None
        for inst, load in zip(candidates, loads, strict=True):
            if load > limit:
                continue
            key = (inst.cached_prefix_blocks(hashes), -load)
            if best_key is None or key > best_key:
                best, best_key = inst, key
        return best
