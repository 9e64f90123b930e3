"""Round-robin routing: ignores load and cache, the baseline every other router must beat."""

from __future__ import annotations

from collections.abc import Sequence

from deepinfer_sched.policies.base import InstanceView, RequestView

__all__ = ["RoundRobinRouter"]


class RoundRobinRouter:
    """Cycles through the candidates; the cursor counts calls, so a shrinking candidate set
    (a dead instance) keeps the rotation going instead of restarting at 0."""

    __slots__ = ("_cursor",)

    def __init__(self) -> None:
        self._cursor = 0

    def route(self, request: RequestView, candidates: Sequence[InstanceView]) -> InstanceView:
        chosen = candidates[self._cursor % len(candidates)]
        self._cursor += 1
        return chosen
