"""Per-request PD choice: short uncached prefills run on the decode instance itself."""

from __future__ import annotations

__all__ = ["PerRequestPD"]


class PerRequestPD:
    """Disaggregated, except that a request whose uncached prompt part (on the decode
    instance chosen for it) is at most ``local_prefill_tokens`` is prefilled there: a short
    prefill costs less than queueing on the prefill pool plus the KV transfer, which is the
    common case for multi-turn chat where the history is already cached."""

    __slots__ = ("local_prefill_tokens",)

    def __init__(self, local_prefill_tokens: int = 512) -> None:
        if local_prefill_tokens < 0:
            raise ValueError(f"local_prefill_tokens must be >= 0, got {local_prefill_tokens}")
        self.local_prefill_tokens = local_prefill_tokens

    @property
    def disaggregated(self) -> bool:
        return True

    def prefill_on_decode(self, uncached_tokens: int) -> bool:
        return uncached_tokens <= self.local_prefill_tokens
