"""Speculative-decoding acceptance models: how many decode steps a sequence needs."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from deepinfer_sched.sim.config import SpecDecodeConfig

__all__ = ["make_steps_for"]


def make_steps_for(spec: SpecDecodeConfig | None, rng: np.random.Generator) -> Callable[[int], int]:
    """A function ``remaining tokens -> decode steps`` for one sequence.

    Without speculation every step emits one token. With it, step ``s`` emits
    ``1 + a_s`` tokens, ``a_s`` drawn i.i.d. from the acceptance model; the steps needed are
    the first ``S`` with ``sum_{s<=S} (1 + a_s) >= remaining``. Drawing all of a sequence's
    steps when it joins is equivalent in distribution to drawing one per step, and keeps
    the event loop free of per-sequence work.
    """
    if spec is None:
        return _plain
    gamma = spec.gamma
    if spec.acceptance == "fixed" or spec.alpha in (0.0, 1.0):
        per_step = 1 + (
            round(spec.alpha * gamma)
            if spec.acceptance == "fixed"
            else (gamma if spec.alpha == 1.0 else 0)
        )

        def fixed(remaining: int) -> int:
            return max(1, math.ceil(remaining / per_step))

        return fixed
    p_reject = 1.0 - spec.alpha
    mean = 1.0 + sum(spec.alpha**k for k in range(1, gamma + 1))

    def geometric(remaining: int) -> int:
        if remaining <= 1:
            return 1
        steps = 0
        left = remaining
        while True:
            k = int(left / mean * 1.2) + 8
            # rng.geometric counts trials up to the first rejection; accepted = trials - 1.
            tokens = 1 + np.minimum(rng.geometric(p_reject, size=k) - 1, gamma)
            cs = np.cumsum(tokens)
            idx = int(np.searchsorted(cs, left))
            if idx < k:
                return steps + idx + 1
            steps += k
            left -= int(cs[-1])

    return geometric


def _plain(remaining: int) -> int:
    return max(1, remaining)
