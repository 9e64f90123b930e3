"""Disaggregated serving: prefill on the prefill pool, then ship the KV to a decode instance."""

from __future__ import annotations

__all__ = ["DisaggregatedPD"]


class DisaggregatedPD:
    """Always prefill remotely; decode instances never run prefill, so their steps stay short
    (the DistServe argument: no prefill-decode interference on TPOT)."""

    __slots__ = ()

    @property
    def disaggregated(self) -> bool:
        return True

    def prefill_on_decode(self, uncached_tokens: int) -> bool:
        return False
