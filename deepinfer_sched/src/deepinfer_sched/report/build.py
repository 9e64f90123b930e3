"""Aggregate request records into a serving report (latency percentiles, goodput, cost)."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from deepinfer_sched.report.records import SLO, RequestRecord
from deepinfer_sched.report.timeline import Timeline

__all__ = ["LatencySummary", "Report", "TenantSummary", "build_report"]

_PCTS = (50.0, 90.0, 99.0)


@dataclass(frozen=True)
class LatencySummary:
    """Mean and p50/p90/p99 (numpy's default linear interpolation); NaN when empty."""

    mean: float
    p50: float
    p90: float
    p99: float
    count: int

    @staticmethod
    def of(values: Iterable[float]) -> LatencySummary:
        a = np.fromiter(values, dtype=np.float64)
        if a.size == 0:
            return LatencySummary(math.nan, math.nan, math.nan, math.nan, 0)
        p = np.percentile(a, _PCTS)
        return LatencySummary(float(a.mean()), float(p[0]), float(p[1]), float(p[2]), int(a.size))


@dataclass(frozen=True)
class TenantSummary:
    """Per-tenant request count, SLO-meeting count and attainment."""

    num_requests: int
    num_met: int
    num_rejected: int
    slo_attainment: float


@dataclass(frozen=True)
class Report:
    """The summary of one simulation run. ``to_dict`` maps NaN to ``None`` for JSON.

    - ``goodput_rps`` = requests meeting both SLOs / ``duration_s``.
    - ``slo_attainment`` = requests meeting both SLOs / all requests (rejected ones fail).
    - ``hit_rate`` = cached input tokens / input tokens, over completed requests.
    - ``utilisation[i]`` = compute utilisation of instance ``i``: the seconds its work
      would keep the attainable FLOP/s fully busy / ``duration_s`` (``compute_s``; a
      decode step of a small batch is mostly memory-bound, so it reads low: the
      headroom is batch room). ``hbm_utilisation[i]`` is the same for HBM bandwidth
      (weights and KV read), and ``busy_fraction[i]`` = seconds with an iteration in
      flight / ``duration_s`` (1 whenever anything decodes, so no headroom measure).
      Without per-step compute/memory seconds all three are the busy fraction.
    - ``timeline``: KV occupancy and queue depth over time, when the simulator sampled it.
    - ``cost_per_million_input_tokens`` = ``(hit_tokens * hit_price + miss_tokens *
      miss_price) / input_tokens * 1e6`` with prices per token: the blended price of a
      million input tokens.
    """

    slo: SLO
    duration_s: float
    num_requests: int
    num_completed: int
    num_rejected: int
    num_met_slo: int
    ttft_s: LatencySummary
    tpot_s: LatencySummary
    e2e_s: LatencySummary
    goodput_rps: float
    throughput_rps: float
    output_tokens_per_s: float
    slo_attainment: float
    hit_rate: float
    input_tokens: int
    cached_tokens: int
    utilisation: dict[int, float]
    mean_utilisation: float
    hit_price: float
    miss_price: float
    cost_per_million_input_tokens: float
    per_tenant: dict[str, TenantSummary] = field(default_factory=dict)
    hbm_utilisation: dict[int, float] = field(default_factory=dict)
    busy_fraction: dict[int, float] = field(default_factory=dict)
    mean_hbm_utilisation: float = math.nan
    mean_busy_fraction: float = math.nan
    timeline: Timeline | None = None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for name in ("utilisation", "hbm_utilisation", "busy_fraction"):
            d[name] = {str(k): v for k, v in sorted(getattr(self, name).items())}
        return _clean(d)  # type: ignore[no-any-return]

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, sort_keys=True, allow_nan=False)


def _clean(x: Any) -> Any:
    if isinstance(x, float):
        return None if not math.isfinite(x) else x
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    return x


def build_report(
    records: Iterable[RequestRecord],
    slo: SLO,
    instance_busy_s: Mapping[int, float],
    duration_s: float,
    hit_price: float,
    miss_price: float,
    *,
    instance_compute_s: Mapping[int, float] | None = None,
    instance_memory_s: Mapping[int, float] | None = None,
    timeline: Timeline | None = None,
) -> Report:
    """Summarise ``records``; see :class:`Report` for every formula.

    ``hit_price``/``miss_price`` are prices per input token (any currency unit);
    ``duration_s`` (> 0) is the wall span the goodput and utilisation are measured over.
    ``instance_compute_s`` / ``instance_memory_s`` (per instance, see :class:`Report`) give
    the compute and HBM utilisation; without them both equal the busy fraction.
    """
    if not (duration_s > 0.0 and math.isfinite(duration_s)):
        raise ValueError(f"duration_s must be finite and > 0, got {duration_s}")
    if hit_price < 0.0 or miss_price < 0.0:
        raise ValueError(f"hit_price and miss_price must be >= 0, got {hit_price}, {miss_price}")
    recs = list(records)
    done = [r for r in recs if not r.rejected]
    met = 0
    tenants: dict[str, list[int]] = {}
    for r in recs:
        ok = r.meets(slo)
        met += ok
        t = tenants.setdefault(r.tenant, [0, 0, 0])
        t[0] += 1
        t[1] += ok
        t[2] += r.rejected
    input_tokens = sum(r.input_len for r in done)
    cached = sum(r.cached_tokens for r in done)
    out_tokens = sum(r.output_len for r in done)
    busy = _fractions("instance_busy_s", instance_busy_s, duration_s)
    util = _fractions("instance_compute_s", instance_compute_s or instance_busy_s, duration_s)
    hbm = _fractions("instance_memory_s", instance_memory_s or instance_busy_s, duration_s)
    if input_tokens:
        cost = (cached * hit_price + (input_tokens - cached) * miss_price) / input_tokens * 1e6
    else:
        cost = math.nan
    n = len(recs)
    return Report(
        slo=slo,
        duration_s=duration_s,
        num_requests=n,
        num_completed=len(done),
        num_rejected=n - len(done),
        num_met_slo=met,
        ttft_s=LatencySummary.of(r.ttft_s for r in done),
        tpot_s=LatencySummary.of(r.tpot_s for r in done),
        e2e_s=LatencySummary.of(r.e2e_s for r in done),
        goodput_rps=met / duration_s,
        throughput_rps=len(done) / duration_s,
        output_tokens_per_s=out_tokens / duration_s,
        slo_attainment=met / n if n else math.nan,
        hit_rate=cached / input_tokens if input_tokens else math.nan,
        input_tokens=input_tokens,
        cached_tokens=cached,
        utilisation=util,
        mean_utilisation=float(np.mean(list(util.values()))) if util else math.nan,
        hit_price=hit_price,
        miss_price=miss_price,
        cost_per_million_input_tokens=cost,
        per_tenant={
            k: TenantSummary(v[0], v[1], v[2], v[1] / v[0]) for k, v in sorted(tenants.items())
        },
        hbm_utilisation=hbm,
        busy_fraction=busy,
        mean_hbm_utilisation=float(np.mean(list(hbm.values()))) if hbm else math.nan,
        mean_busy_fraction=float(np.mean(list(busy.values()))) if busy else math.nan,
        timeline=timeline,
    )


def _fractions(name: str, seconds: Mapping[int, float], duration_s: float) -> dict[int, float]:
    out = {int(k): float(v) / duration_s for k, v in sorted(seconds.items())}
    if any(not (v >= 0.0) for v in out.values()):
        raise ValueError(f"{name} values must be >= 0")
    return out
