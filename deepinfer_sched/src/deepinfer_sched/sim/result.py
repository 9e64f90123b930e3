"""``SimResult``: the raw outcome of one simulation run (records, counters, timeline)."""

from __future__ import annotations

from dataclasses import dataclass, field

from deepinfer_sched.report import SLO, Report, RequestRecord, Timeline, build_report

__all__ = ["SimResult"]


@dataclass
class SimResult:
    """Raw outcome of a run: one record per request plus counters."""

    records: list[RequestRecord]
    instance_busy_s: dict[int, float]
    duration_s: float
    rejections: dict[str, int] = field(default_factory=dict)
    preemptions: int = 0
    migrations: int = 0
    rerouted: int = 0
    events: int = 0
    instance_compute_s: dict[int, float] | None = None
    instance_memory_s: dict[int, float] | None = None
    timeline: Timeline | None = None
    instance_seconds: float = 0.0
    fleet_size: tuple[tuple[float, int], ...] = ()

    def report(self, slo: SLO, hit_price: float, miss_price: float) -> Report:
        """Summarise with :func:`deepinfer_sched.report.build_report`."""
        return build_report(
            self.records,
            slo,
            self.instance_busy_s,
            self.duration_s,
            hit_price,
            miss_price,
            instance_compute_s=self.instance_compute_s,
            instance_memory_s=self.instance_memory_s,
            timeline=self.timeline,
        )

    def stats(self) -> dict[str, object]:
        """Simulator counters as a JSON-ready dict."""
        return {
            "rejections": dict(sorted(self.rejections.items())),
            "preemptions": self.preemptions,
            "migrations": self.migrations,
            "rerouted": self.rerouted,
            "events": self.events,
            "instance_hours": self.instance_seconds / 3600.0,
        }
