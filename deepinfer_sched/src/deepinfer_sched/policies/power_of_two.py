"""Power-of-two-choices routing: sample two candidates, keep the less loaded one."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from deepinfer_sched.policies.base import InstanceView, RequestView
from deepinfer_sched.policies.least_loaded import outstanding

__all__ = ["PowerOfTwoRouter"]


class PowerOfTwoRouter:
    """Two distinct candidates drawn uniformly from a seeded generator; the one with fewer
    outstanding requests wins (the first drawn on a tie). O(1) per decision, and with n
    instances the maximum queue grows as log log n instead of log n / log log n."""

    __slots__ = ("_rng",)

    def __init__(self, seed: int = 0) -> None:
        self._rng = np.random.default_rng(seed)

    def route(self, request: RequestView, candidates: Sequence[InstanceView]) -> InstanceView:
        n = len(candidates)
        if n == 1:
            return candidates[0]
        i = int(self._rng.integers(n))
        j = int(self._rng.integers(n - 1))
        if j >= i:
            j += 1
        a, b = candidates[i], candidates[j]
        return b if outstanding(b) < outstanding(a) else a
