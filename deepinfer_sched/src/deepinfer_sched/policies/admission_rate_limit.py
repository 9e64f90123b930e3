"""Per-tenant token-bucket rate limits on prompt + output tokens."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from deepinfer_sched.policies.base import RequestView

__all__ = ["RateLimit", "TenantRateLimiter"]


@dataclass(frozen=True)
class RateLimit:
    """A bucket refilled at ``tokens_per_s`` holding at most ``burst_tokens``."""

    tokens_per_s: float
    burst_tokens: float

    def __post_init__(self) -> None:
        if not self.tokens_per_s > 0:
            raise ValueError(f"tokens_per_s must be > 0, got {self.tokens_per_s}")
        if not self.burst_tokens > 0:
            raise ValueError(f"burst_tokens must be > 0, got {self.burst_tokens}")


class TenantRateLimiter:
    """One token bucket per tenant; a request costs ``input_len + output_len`` tokens and is
    rejected (without draining the bucket) when the bucket holds fewer. Tenants without an
    entry use ``default`` or are unlimited when it is None. Buckets start full.

    Time must not go backwards between calls (the simulator and a gateway both feed arrival
    order); a smaller ``now_s`` raises ValueError.
    """

    __slots__ = ("_buckets", "default", "limits")

    def __init__(self, limits: Mapping[str, RateLimit], default: RateLimit | None = None):
        self.limits = dict(limits)
        self.default = default
        self._buckets: dict[str, tuple[float, float]] = {}

    def check(
        self, request: RequestView, now_s: float, predicted_ttft_s: Callable[[], float]
    ) -> str | None:
        lim = self.limits.get(request.tenant, self.default)
        if lim is None:
            return None
        level, last = self._buckets.get(request.tenant, (lim.burst_tokens, now_s))
        if now_s < last:
            raise ValueError(f"now_s must not decrease: got {now_s} after {last}")
        level = min(lim.burst_tokens, level + (now_s - last) * lim.tokens_per_s)
        cost = request.input_len + request.output_len
        if cost > level:
            self._buckets[request.tenant] = (level, now_s)
            return "rate_limited"
        self._buckets[request.tenant] = (level - cost, now_s)
        return None
