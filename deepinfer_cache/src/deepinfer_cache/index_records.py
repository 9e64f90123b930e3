"""What ``PrefixIndex`` hands back: a match's length and tiers, and the blocks it dropped."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MatchResult:
    """``num_blocks`` leading blocks are cached; ``tiers[i]`` is block i's tier bitmask."""

    num_blocks: int
    tiers: tuple[int, ...]

    def blocks_in(self, tier: int) -> int:
        """How many matched blocks are resident in ``tier``."""
        bit = 1 << tier
        return sum(1 for m in self.tiers if m & bit)


@dataclass(frozen=True)
class Dropped:
    """A block removed from the index; ``tiers`` is the bitmask whose data must be freed."""

    key: bytes
    tiers: int
