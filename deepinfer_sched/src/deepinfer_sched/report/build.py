"""Aggregate request records into a serving report (latency percentiles, goodput, cost)."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from deepinfer_sched.report.records import SLO, RequestRecord

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
    - ``utilisation[i]`` = busy seconds of instance ``i`` / ``duration_s``.
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

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["utilisation"] = {str(k): v for k, v in sorted(self.utilisation.items())}
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
) -> Report:
    """Summarise ``records``; see :class:`Report` for every formula.

    ``hit_price``/``miss_price`` are prices per input token (any currency unit);
    ``duration_s`` (> 0) is the wall span the goodput and utilisation are measured over.
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
    util = {int(k): float(v) / duration_s for k, v in instance_busy_s.items()}
    if any(v < 0.0 for v in util.values()):
        raise ValueError("instance_busy_s values must be >= 0")
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
        utilisation=dict(sorted(util.items())),
        mean_utilisation=float(np.mean(list(util.values()))) if util else math.nan,
        hit_price=hit_price,
        miss_price=miss_price,
        cost_per_million_input_tokens=cost,
        per_tenant={
            k: TenantSummary(v[0], v[1], v[2], v[1] / v[0]) for k, v in sorted(tenants.items())
        },
    )
