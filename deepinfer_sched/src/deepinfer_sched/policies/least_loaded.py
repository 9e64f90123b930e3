"""Least-loaded routing: fewest outstanding requests (queued + running)."""

from __future__ import annotations

from collections.abc import Sequence

from deepinfer_sched.policies.base import InstanceView, RequestView

__all__ = ["LeastLoadedRouter", "outstanding"]


def outstanding(inst: InstanceView) -> int:
    """Load measure shared by the load-only routers: queued plus running requests."""
    return inst.num_waiting + inst.num_running


class LeastLoadedRouter:
    """Picks the candidate with the fewest outstanding requests; ties go to the lower
    position in ``candidates`` so the choice is deterministic."""

    __slots__ = ()

    def route(self, request: RequestView, candidates: Sequence[InstanceView]) -> InstanceView:
        best = candidates[0]
        best_load = outstanding(best)
        for inst in candidates[1:]:
            load = outstanding(inst)
            if load < best_load:
                best, best_load = inst, load
        return best
