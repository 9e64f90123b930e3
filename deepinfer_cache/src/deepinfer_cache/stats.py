"""Counters the store keeps, their snapshot (``StoreStats``) and the cost report.

``StoreStats.prometheus()`` renders the snapshot in the Prometheus text exposition format
(counters end in ``_total``; per-tier series carry a ``tier`` label), and ``metric_samples()``
gives the same as ``(name, kind, labels, value)`` tuples for a server that registers them with
``prometheus_client`` (the cache itself does not depend on it).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class TierStats:
    name: str
    blocks: int = 0
    used_bytes: int = 0
    capacity_bytes: int = 0
    hit_blocks: int = 0
    hit_tokens: int = 0
    evictions: int = 0
    skipped_no_room: int = 0
    put_errors: int = 0  # the tier's copy raised (the block was not cached there)
    writeback_dropped: int = 0  # disk writes refused because the write queue was full
    bytes_written: int = 0
    bytes_read: int = 0
    write_bandwidth: float = 0.0  # bytes/s while writing (I/O threads' time)
    read_bandwidth: float = 0.0


@dataclass
class StoreStats:
    """A snapshot of the store's counters. ``hit_rate`` is token-weighted: cached prompt tokens
    over all prompt tokens looked up."""

    lookups: int = 0
    query_tokens: int = 0
    hit_tokens: int = 0
    stored_blocks: int = 0
    promotions: int = 0
    demotions: int = 0
    expired: int = 0
    corrupt_quarantined: int = 0
    write_errors: int = 0
    orphans_removed: int = 0
    fetch_failures: int = 0
    skipped_blocks: int = 0
    deleted_blocks: int = 0
    unknown_class_blocks: int = 0
    writeback_dropped: int = 0
    put_errors: int = 0
    tiers: list[TierStats] = field(default_factory=list)

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.query_tokens if self.query_tokens else 0.0

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["hit_rate"] = self.hit_rate
        return d

    def metric_samples(
        self, prefix: str = "deepinfer_cache"
    ) -> list[tuple[str, str, dict[str, str], float]]:
        """``(name, "counter" | "gauge", labels, value)`` for every metric."""
        out: list[tuple[str, str, dict[str, str], float]] = []
        for name in _STORE_COUNTERS:
            out.append((f"{prefix}_{name}_total", "counter", {}, float(getattr(self, name))))
        out.append((f"{prefix}_hit_rate", "gauge", {}, self.hit_rate))
        for t in self.tiers:
            lab = {"tier": t.name}
            for name in _TIER_COUNTERS:
                out.append((f"{prefix}_tier_{name}_total", "counter", lab, float(getattr(t, name))))
            for name in _TIER_GAUGES:
                out.append((f"{prefix}_tier_{name}", "gauge", lab, float(getattr(t, name))))
        return out

    def prometheus(self, prefix: str = "deepinfer_cache") -> str:
        """The snapshot in the Prometheus text exposition format (version 0.0.4)."""
        lines: list[str] = []
        typed: set[str] = set()
        for name, kind, labels, value in self.metric_samples(prefix):
            if name not in typed:
                typed.add(name)
                lines.append(f"# TYPE {name} {kind}")
            lab = ",".join(f'{k}="{v}"' for k, v in labels.items())
            lines.append(f"{name}{{{lab}}} {value!r}" if lab else f"{name} {value!r}")
        return "\n".join(lines) + "\n"


_STORE_COUNTERS = (
    "lookups",
    "query_tokens",
    "hit_tokens",
    "stored_blocks",
    "promotions",
    "demotions",
    "expired",
    "corrupt_quarantined",
    "write_errors",
    "orphans_removed",
    "fetch_failures",
    "skipped_blocks",
    "deleted_blocks",
    "writeback_dropped",
    "put_errors",
)
_TIER_COUNTERS = (
    "hit_blocks",
    "hit_tokens",
    "evictions",
    "skipped_no_room",
    "put_errors",
    "writeback_dropped",
    "bytes_written",
    "bytes_read",
)
_TIER_GAUGES = ("blocks", "used_bytes", "capacity_bytes")


def collect_stats(store: Any) -> StoreStats:
    """Snapshot ``store``'s counters (the caller holds the store lock)."""
    tiers = []
    for i, t in enumerate(store.tiers):
        tc = store._tier_c[i]
        ts = TierStats(
            name=t.name,
            blocks=store.index.count_in(i),
            used_bytes=t.used_bytes(),
            capacity_bytes=t.capacity_bytes,
            hit_blocks=tc["hit_blocks"],
            hit_tokens=tc["hit_blocks"] * store.block_size,
            evictions=tc["evictions"],
            skipped_no_room=tc["skipped"],
            put_errors=tc["put_errors"],
        )
        cnt = getattr(t, "counters", None)
        if cnt is not None:
            ts.bytes_written, ts.bytes_read = cnt.bytes_written, cnt.bytes_read
            ts.writeback_dropped = cnt.writeback_dropped
            ts.write_bandwidth = cnt.bytes_written / cnt.write_seconds if cnt.write_seconds else 0.0
            ts.read_bandwidth = cnt.bytes_read / cnt.read_seconds if cnt.read_seconds else 0.0
        tiers.append(ts)
    c = store._c
    counters = [getattr(t, "counters", None) for t in store.tiers]
    return StoreStats(
        lookups=c["lookups"],
        query_tokens=c["query_tokens"],
        hit_tokens=c["hit_tokens"],
        stored_blocks=c["stored_blocks"],
        promotions=c["promotions"],
        demotions=c["demotions"],
        expired=c["expired"],
        corrupt_quarantined=sum(getattr(x, "corrupt_quarantined", 0) for x in counters),
        write_errors=sum(getattr(x, "write_errors", 0) for x in counters),
        orphans_removed=c["orphans_removed"],
        fetch_failures=c["fetch_failures"],
        skipped_blocks=c["skipped_blocks"],
        deleted_blocks=c["deleted_blocks"],
        unknown_class_blocks=c["unknown_class_blocks"],
        writeback_dropped=sum(getattr(x, "writeback_dropped", 0) for x in counters),
        put_errors=sum(tc["put_errors"] for tc in store._tier_c),
        tiers=tiers,
    )


@dataclass(frozen=True)
class CostReport:
    """Prefill cost with and without the cache at per-million-token prices."""

    hit_tokens: int
    miss_tokens: int
    hit_price: float
    miss_price: float

    @property
    def cost(self) -> float:
        return (self.hit_tokens * self.hit_price + self.miss_tokens * self.miss_price) / 1e6

    @property
    def cost_without_cache(self) -> float:
        return (self.hit_tokens + self.miss_tokens) * self.miss_price / 1e6

    @property
    def savings_fraction(self) -> float:
        base = self.cost_without_cache
        return 1.0 - self.cost / base if base else 0.0

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(
            cost=self.cost,
            cost_without_cache=self.cost_without_cache,
            savings_fraction=self.savings_fraction,
        )
        return d
