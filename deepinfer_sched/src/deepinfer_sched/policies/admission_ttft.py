"""Early rejection: refuse a request whose predicted TTFT already breaks the SLO."""

from __future__ import annotations

from collections.abc import Callable

from deepinfer_sched.policies.base import RequestView

__all__ = ["TTFTAdmission"]


class TTFTAdmission:
    """Rejects when ``predicted_ttft > slack * ttft_slo_s``. Rejecting at arrival costs the
    client one fast retry elsewhere, while admitting a request that will miss its SLO anyway
    burns prefill compute and delays every request queued behind it."""

    __slots__ = ("slack", "ttft_slo_s")

    def __init__(self, ttft_slo_s: float, slack: float = 1.0) -> None:
        if not ttft_slo_s > 0:
            raise ValueError(f"ttft_slo_s must be > 0, got {ttft_slo_s}")
        if not slack > 0:
            raise ValueError(f"slack must be > 0, got {slack}")
        self.ttft_slo_s = ttft_slo_s
        self.slack = slack

    def check(
        self, request: RequestView, now_s: float, predicted_ttft_s: Callable[[], float]
    ) -> str | None:
        if predicted_ttft_s() > self.slack * self.ttft_slo_s:
            return "predicted_ttft"
        return None
