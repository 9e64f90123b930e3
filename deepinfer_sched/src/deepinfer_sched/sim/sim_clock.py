"""``SimClock``: the simulator's current time, one object shared with every instance."""

from __future__ import annotations

__all__ = ["SimClock"]


class SimClock:
    """The simulator's current time, shared with its instances so that a load signal read
    in the middle of a fast-forwarded decode stretch reflects the steps already done."""

    __slots__ = ("now",)

    def __init__(self) -> None:
        self.now = 0.0
