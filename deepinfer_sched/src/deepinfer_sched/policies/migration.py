"""Decode load balancing by migration: move KV off instances far above the mean."""

from __future__ import annotations

from collections.abc import Sequence

from deepinfer_sched.policies.base import InstanceView, MigrationMove

__all__ = ["ThresholdMigration"]


class ThresholdMigration:
    """Every ``interval_s``: each instance whose ``kv_used_tokens`` exceeds ``threshold`` x the
    mean sends its excess over the mean to the least loaded instance that stays at or below
    the mean after receiving it. The simulator pays ``kv_transfer_time`` for every moved
    sequence, during which that sequence does not decode."""

    __slots__ = ("_interval_s", "threshold")

    def __init__(self, threshold: float = 1.5, interval_s: float = 1.0) -> None:
        if not threshold > 1.0:
            raise ValueError(f"threshold must be > 1, got {threshold}")
        if not interval_s > 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s}")
        self.threshold = threshold
        self._interval_s = interval_s

    @property
    def interval_s(self) -> float:
        return self._interval_s

    def plan(self, instances: Sequence[InstanceView]) -> list[MigrationMove]:
        if len(instances) < 2:
            return []
        load = {inst.instance_id: inst.kv_used_tokens for inst in instances}
        mean = sum(load.values()) / len(load)
        if mean <= 0:
            return []
        moves: list[MigrationMove] = []
        for src in sorted(load, key=lambda i: (-load[i], i)):
            if load[src] <= self.threshold * mean:
                break
            excess = int(load[src] - mean)
            dst = min(load, key=lambda i: (load[i], i))
            room = int(mean - load[dst])
            amount = min(excess, room)
            if dst == src or amount <= 0:
                continue
            moves.append(MigrationMove(src, dst, amount))
            load[src] -= amount
            load[dst] += amount
        return moves
