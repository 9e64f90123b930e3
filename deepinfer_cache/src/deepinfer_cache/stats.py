"""Counters the store keeps, their snapshot (``StoreStats``) and the cost report."""

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
    tiers: list[TierStats] = field(default_factory=list)

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.query_tokens if self.query_tokens else 0.0

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["hit_rate"] = self.hit_rate
        return d


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
