"""Sampling for the lean runtime, in numpy: greedy, or temperature / top-k / top-p / min-p with
a seed.

Greedy (``temperature=0``) is the argmax, the engine's rule, so greedy output equals the
engine's wherever the logits rank the same. Sampled output follows the same distribution as the
engine's (vLLM's order: temperature, then top-k, top-p and min-p on the probabilities) but draws
from numpy's generator, not torch's: the same seed gives another, equally valid sample.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class LeanSampling:
    """What the lean runtime generates with; checked here, each error naming its field.

    Example::

        params = LeanSampling(temperature=0.7, top_p=0.9, seed=1, max_tokens=32)
    """

    temperature: float = 1.0
    top_k: int = -1
    top_p: float = 1.0
    min_p: float = 0.0
    max_tokens: int = 16
    min_tokens: int = 0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise ValueError(f"temperature must be finite and >= 0, got {self.temperature}")
        if not isinstance(self.top_k, int) or (self.top_k != -1 and self.top_k < 1):
            raise ValueError(f"top_k must be -1 (off) or >= 1, got {self.top_k}")
        if not (0 < self.top_p <= 1):
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if not (0 <= self.min_p <= 1):
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if not isinstance(self.min_tokens, int) or not 0 <= self.min_tokens <= self.max_tokens:
            raise ValueError(
                f"min_tokens must be in [0, max_tokens={self.max_tokens}], got {self.min_tokens}"
            )
        if self.seed is not None and (not isinstance(self.seed, int) or self.seed < 0):
            raise ValueError(f"seed must be an int >= 0 or None, got {self.seed}")
        stops = tuple(self.stop or ())
        if any(not isinstance(s, str) or not s for s in stops):
            raise ValueError(f"stop must be non-empty strings, got {list(stops)}")
        object.__setattr__(self, "stop", stops)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


class Sampler:
    """Draws tokens for one request: from its own generator when ``params.seed`` is set, else
    from ``shared`` (the runtime's, seeded once, as the engine's ``EngineConfig.seed``: a fresh
    process gives the same output for the same requests)."""

    def __init__(self, params: LeanSampling, shared: np.random.Generator | None = None) -> None:
        self.params = params
        if params.seed is not None or shared is None:
            shared = np.random.default_rng(params.seed)
        self.rng = shared

    def __call__(self, logits: np.ndarray, banned: Sequence[int] = ()) -> int:
        """A token from ``logits`` ``[vocab]``, never one of ``banned`` (EOS before
        ``min_tokens``)."""
        if banned:
            logits = logits.copy()
            logits[list(banned)] = -np.inf
        p = self.params
        if p.greedy:
            return int(np.argmax(logits))
        scaled = logits.astype(np.float64) / p.temperature
        order = np.argsort(-scaled, kind="stable")
        if p.top_k != -1:
            order = order[: p.top_k]
        top = scaled[order]
        probs = np.exp(top - top[0])
        probs /= probs.sum()
        keep = len(order)
        if p.top_p < 1:
            # The smallest prefix whose mass reaches top_p (the first token always stays).
            keep = min(keep, int(np.searchsorted(np.cumsum(probs), p.top_p)) + 1)
        if p.min_p > 0:
            keep = min(keep, max(1, int(np.count_nonzero(probs >= p.min_p * probs[0]))))
        probs = probs[:keep] / probs[:keep].sum()
        return int(order[int(self.rng.choice(keep, p=probs))])
