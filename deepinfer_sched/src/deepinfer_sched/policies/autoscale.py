"""SLO-driven autoscaling: add or remove instances from the attainment observed over a
recent window, with a cooldown between actions (the shape of Dynamo's SLA planner)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from deepinfer_sched._checks import check_int, check_real

__all__ = ["AutoscaleConfig", "SLOAutoscaler"]


@dataclass(frozen=True)
class AutoscaleConfig:
    """Knobs of :class:`SLOAutoscaler`.

    Every ``interval_s`` the policy looks at the requests that finished in the last
    ``window_s``: attainment below ``target`` (or a request waiting for its first token
    longer than the TTFT SLO) adds ``step`` instances, more in proportion when attainment
    is far below (``ceil(active (target - attainment))``); attainment at or above
    ``scale_down_at`` with no request waiting longer than half the TTFT SLO removes one.
    After any action nothing changes for ``cooldown_s``, and nothing is removed for
    ``down_cooldown_s`` after any action (removing is cheap to get wrong and slow to undo:
    a new instance serves only after ``startup_s``).

    ``capacity_rps`` (per instance, e.g. measured by simulating one instance or profiled on
    the engine) adds the load forecast Dynamo's planner uses: an instance is removed only
    if the window's arrival rate fits the remaining ones at ``down_headroom`` of their
    capacity, and instances are added as soon as the rate exceeds the fleet's capacity. The fleet stays within ``[min_instances, max_instances]``
    (``max_instances`` None: the simulated cluster size); it starts at ``initial``
    (None: ``max_instances``). A new instance serves after ``startup_s``; a removed one
    takes no new requests and is switched off once it has drained.
    """

    target: float = 0.95
    scale_down_at: float = 0.99
    window_s: float = 60.0
    interval_s: float = 15.0
    cooldown_s: float = 60.0
    down_cooldown_s: float = 180.0
    step: int = 1
    min_instances: int = 1
    max_instances: int | None = None
    initial: int | None = None
    startup_s: float = 30.0
    capacity_rps: float | None = None
    down_headroom: float = 0.8

    def __post_init__(self) -> None:
        for name in (
            "target",
            "scale_down_at",
            "window_s",
            "interval_s",
            "cooldown_s",
            "down_cooldown_s",
        ):
            check_real("AutoscaleConfig", name, getattr(self, name))
        check_real("AutoscaleConfig", "startup_s", self.startup_s)
        check_real("AutoscaleConfig", "down_headroom", self.down_headroom)
        if self.capacity_rps is not None:
            check_real("AutoscaleConfig", "capacity_rps", self.capacity_rps)
            if not self.capacity_rps > 0:
                raise ValueError("AutoscaleConfig.capacity_rps must be > 0")
        if not 0.0 < self.down_headroom <= 1.0:
            raise ValueError("AutoscaleConfig.down_headroom must be in (0, 1]")
        for name in ("step", "min_instances"):
            check_int("AutoscaleConfig", name, getattr(self, name))
        for name in ("max_instances", "initial"):
            if getattr(self, name) is not None:
                check_int("AutoscaleConfig", name, getattr(self, name))
        if not 0.0 < self.target <= self.scale_down_at <= 1.0:
            raise ValueError(
                "AutoscaleConfig needs 0 < target <= scale_down_at <= 1, got "
                f"{self.target}, {self.scale_down_at}"
            )
        if not (self.window_s > 0 and self.interval_s > 0):
            raise ValueError("AutoscaleConfig.window_s and interval_s must be > 0")
        if min(self.cooldown_s, self.down_cooldown_s, self.startup_s) < 0:
            raise ValueError(
                "AutoscaleConfig.cooldown_s, down_cooldown_s and startup_s must be >= 0"
            )
        if self.step < 1 or self.min_instances < 1:
            raise ValueError("AutoscaleConfig.step and min_instances must be >= 1")
        hi = self.max_instances
        if hi is not None and hi < self.min_instances:
            raise ValueError("AutoscaleConfig.max_instances must be >= min_instances")
        if self.initial is not None and not (
            self.min_instances <= self.initial <= (hi if hi is not None else math.inf)
        ):
            raise ValueError("AutoscaleConfig.initial must lie in [min_instances, max_instances]")


class SLOAutoscaler:
    """Decides fleet changes from windowed SLO attainment; a gateway can call it too.

    ``decide(now, met, total, oldest_wait_s, active, arrival_rps)`` returns the change in
    instance count. ``met``/``total`` count the requests finished in the last window
    (``total = 0`` counts as meeting the SLO), ``oldest_wait_s`` is how long the oldest
    request still waiting for its first token has waited, ``active`` the instances serving
    or starting, ``arrival_rps`` the arrival rate over the window (used with
    ``capacity_rps``).
    """

    __slots__ = ("_last_action_s", "cfg", "max_instances", "ttft_slo_s")

    def __init__(self, cfg: AutoscaleConfig, max_instances: int, ttft_slo_s: float) -> None:
        self.cfg = cfg
        self.max_instances = cfg.max_instances if cfg.max_instances is not None else max_instances
        self.ttft_slo_s = ttft_slo_s
        self._last_action_s = -math.inf

    def decide(
        self,
        now: float,
        met: int,
        total: int,
        oldest_wait_s: float,
        active: int,
        arrival_rps: float = 0.0,
    ) -> int:
        cfg = self.cfg
        since = now - self._last_action_s
        if since < cfg.cooldown_s:
            return 0
        attainment = met / total if total else 1.0
        delta = 0
        cap = cfg.capacity_rps
        need = math.ceil(arrival_rps / cap) if cap else 0
        if attainment < cfg.target or oldest_wait_s > self.ttft_slo_s or need > active:
            want = max(cfg.step, math.ceil(active * (cfg.target - attainment)), need - active)
            delta = max(0, min(want, self.max_instances - active))
        elif (
            attainment >= cfg.scale_down_at
            and oldest_wait_s <= 0.5 * self.ttft_slo_s
            and active > cfg.min_instances
            and since >= cfg.down_cooldown_s
            and (cap is None or arrival_rps <= (active - 1) * cap * cfg.down_headroom)
        ):
            delta = -1
        if delta:
            self._last_action_s = now
        return delta
