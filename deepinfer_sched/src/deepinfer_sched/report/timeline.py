"""Cluster state over time: KV occupancy and queue depth sampled at a fixed interval."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Timeline"]


@dataclass(frozen=True)
class Timeline:
    """Samples at times ``t_s`` (seconds since the trace start) over the live instances.

    ``kv_occupancy_*`` is KV held (decoding contexts, prefills in progress, KV in transfer
    to the instance) over KV capacity, mean and max over instances; ``queue_depth_*`` is
    requests accepted but not yet decoding (queued, fetching from SSD, prefilling), summed
    and max over instances. All tuples have the length of ``t_s``.
    """

    t_s: tuple[float, ...]
    kv_occupancy_mean: tuple[float, ...]
    kv_occupancy_max: tuple[float, ...]
    queue_depth_total: tuple[int, ...]
    queue_depth_max: tuple[int, ...]

    def __post_init__(self) -> None:
        n = len(self.t_s)
        for name in ("kv_occupancy_mean", "kv_occupancy_max", "queue_depth_total"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"Timeline.{name} must have {n} samples like t_s")
        if len(self.queue_depth_max) != n:
            raise ValueError(f"Timeline.queue_depth_max must have {n} samples like t_s")

    @property
    def peak_kv_occupancy(self) -> float:
        """Highest KV occupancy any instance reached at a sample (0 with no samples)."""
        return max(self.kv_occupancy_max, default=0.0)

    @property
    def peak_queue_depth(self) -> int:
        """Deepest queue any instance had at a sample (0 with no samples)."""
        return max(self.queue_depth_max, default=0)
