"""Colocated serving: every instance prefills and decodes its own requests."""

from __future__ import annotations

__all__ = ["ColocatedPD"]


class ColocatedPD:
    """No prefill/decode split; prefill chunks and decode steps share each iteration."""

    __slots__ = ()

    @property
    def disaggregated(self) -> bool:
        return False

    def prefill_on_decode(self, uncached_tokens: int) -> bool:
        return True
