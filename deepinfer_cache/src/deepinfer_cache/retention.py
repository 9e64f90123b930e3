"""Retention classes: how long an entry lives after its last store (chat 7 days, agent 3 days)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

DAY = 86_400.0


def _default_ttls() -> Mapping[str, float]:
    return MappingProxyType({"chat": 7 * DAY, "agent": 3 * DAY})


@dataclass(frozen=True)
class RetentionPolicy:
    """Time-to-live in seconds per retention class.

    >>> RetentionPolicy().ttl("agent") / DAY
    3.0
    """

    ttls: Mapping[str, float] = field(default_factory=_default_ttls)

    def __post_init__(self) -> None:
        if not self.ttls:
            raise ValueError("ttls must name at least one retention class")
        for name, ttl in self.ttls.items():
            if not isinstance(name, str) or not name or len(name.encode()) > 32:
                raise ValueError(f"retention class names must be 1-32 byte str, got {name!r}")
            if not isinstance(ttl, int | float) or not ttl > 0:
                raise ValueError(f"ttl for {name!r} must be a positive number of seconds")
        object.__setattr__(self, "ttls", MappingProxyType(dict(self.ttls)))

    def ttl(self, retention: str) -> float:
        try:
            return float(self.ttls[retention])
        except KeyError:
            raise ValueError(
                f"retention must be one of {sorted(self.ttls)}, got {retention!r}"
            ) from None
