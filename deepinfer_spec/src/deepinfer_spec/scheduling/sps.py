"""Steps-per-second curve ``SPS(B)`` of the target's verify forward and its profiler."""

from __future__ import annotations

import itertools
import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor


def _isotonic_non_decreasing(values: list[float]) -> list[float]:
    """Least-squares non-decreasing fit (pool adjacent violators), equal weights."""
    blocks: list[list[float]] = []  # [mean, weight]
    for v in values:
        blocks.append([v, 1.0])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            m2, w2 = blocks.pop()
            m1, w1 = blocks.pop()
            blocks.append([(m1 * w1 + m2 * w2) / (w1 + w2), w1 + w2])
    out: list[float] = []
    for mean, weight in blocks:
        out.extend([mean] * int(weight))
    return out


@dataclass(frozen=True)
class SPSCurve:
    """Target verify steps per second as a function of the verify batch size ``B``.

    ``B`` counts every token in the verify forward, the ``R`` anchors included. The profiled step
    times ``1 / SPS`` are made non-decreasing in ``B`` by isotonic regression (a larger batch is
    never faster; profiling noise can say otherwise) and interpolated linearly in ``B``, which keeps
    the curve monotone. Below the first point the first step time holds; above the last one the
    last segment's slope is extended (decode cost grows linearly once compute-bound).

    Attributes:
        batch_sizes: strictly increasing positive batch sizes.
        steps_per_second: measured steps per second at each batch size (> 0).
    """

    batch_sizes: tuple[int, ...]
    steps_per_second: tuple[float, ...]
    _times: tuple[float, ...] = field(init=False, repr=False, compare=False)
    _xs: Tensor = field(init=False, repr=False, compare=False)
    _ts: Tensor = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        bs = tuple(int(b) for b in self.batch_sizes)
        sps = tuple(float(s) for s in self.steps_per_second)
        if not bs or len(bs) != len(sps):
            raise ValueError("batch_sizes and steps_per_second must be non-empty and equally long")
        if bs[0] < 1 or any(b2 <= b1 for b1, b2 in itertools.pairwise(bs)):
            raise ValueError(f"batch_sizes must be strictly increasing and >= 1, got {bs}")
        if any(not math.isfinite(s) or s <= 0 for s in sps):
            raise ValueError("steps_per_second must be finite and > 0")
        object.__setattr__(self, "batch_sizes", bs)
        object.__setattr__(self, "steps_per_second", sps)
        times = tuple(_isotonic_non_decreasing([1 / s for s in sps]))
        object.__setattr__(self, "_times", times)
        # Built once: the scheduler evaluates the curve every decode step.
        object.__setattr__(self, "_xs", torch.tensor(bs, dtype=torch.float64))
        object.__setattr__(self, "_ts", torch.tensor(times, dtype=torch.float64))

    @classmethod
    def flat(cls, steps_per_second: float = 100.0, max_batch_size: int = 4096) -> SPSCurve:
        """A curve where batch size costs nothing: verifying more never slows a step."""
        return cls((1, max_batch_size), (steps_per_second, steps_per_second))

    @classmethod
    def roofline(
        cls,
        weight_read_s: float,
        per_token_s: float,
        *,
        overlap: float = 0.0,
        max_batch_size: int = 4096,
        num_points: int = 64,
    ) -> SPSCurve:
        """A synthetic decode curve from first principles.

        Step time ``t(B) = (1 - overlap) * (t_w + B t_c) + overlap * max(t_w, B t_c)`` with
        ``t_w = weight_read_s`` (streaming the weights once per step, memory-bound) and
        ``t_c = per_token_s`` (compute per verified token). ``overlap = 0`` adds the two (no
        overlap of weight streaming and math), ``overlap = 1`` is the ideal roofline
        ``max(t_w, B t_c)``. Sampled at ``num_points`` geometrically spaced batch sizes.
        """
        if weight_read_s <= 0 or per_token_s < 0:
            raise ValueError("weight_read_s must be > 0 and per_token_s >= 0")
        if not 0.0 <= overlap <= 1.0:
            raise ValueError(f"overlap must be in [0, 1], got {overlap}")
        if max_batch_size < 2 or num_points < 2:
            raise ValueError("max_batch_size and num_points must be >= 2")
        raw = torch.logspace(0, math.log10(max_batch_size), num_points, dtype=torch.float64)
        points = sorted({round(float(b)) for b in raw} | {1, max_batch_size})
        if overlap > 0:  # the ridge point is where the kink sits: sample it exactly
            ridge = weight_read_s / per_token_s if per_token_s > 0 else 0.0
            for b in (math.floor(ridge), math.ceil(ridge)):
                if 1 <= b <= max_batch_size:
                    points.append(int(b))
            points = sorted(set(points))

        def step_time(b: int) -> float:
            add = weight_read_s + b * per_token_s
            mx = max(weight_read_s, b * per_token_s)
            return (1 - overlap) * add + overlap * mx

        return cls(tuple(points), tuple(1.0 / step_time(b) for b in points))

    def step_time(self, batch_size: Tensor) -> Tensor:
        """Interpolated step time (s) at each entry of ``batch_size`` (float64, same device)."""
        b = batch_size.to(torch.float64)
        xs, ts = self._xs.to(b.device), self._ts.to(b.device)
        if xs.numel() == 1:
            return ts.expand_as(b).clone()
        seg = (torch.searchsorted(xs, b, right=True) - 1).clamp(0, xs.numel() - 2)
        x0, x1, t0, t1 = xs[seg], xs[seg + 1], ts[seg], ts[seg + 1]
        t = t0 + (b - x0) * (t1 - t0) / (x1 - x0)
        return torch.where(b < xs[0], ts[0], t)

    def __call__(self, batch_size: Tensor) -> Tensor:
        """``SPS(B)`` at each entry of ``batch_size`` (float64, same device)."""
        return 1.0 / self.step_time(batch_size)

    def at(self, batch_size: int) -> float:
        """``SPS(B)`` for one batch size."""
        if batch_size < 0:
            raise ValueError(f"batch_size must be >= 0, got {batch_size}")
        return float(self(torch.tensor([float(batch_size)]))[0])

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (the profile is saved once per deployment, never pickled)."""
        return {
            "batch_sizes": list(self.batch_sizes),
            "steps_per_second": list(self.steps_per_second),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SPSCurve:
        """Inverse of :meth:`to_dict`."""
        if not isinstance(data, dict) or {"batch_sizes", "steps_per_second"} - data.keys():
            raise ValueError("data must be a dict with 'batch_sizes' and 'steps_per_second'")
        return cls(tuple(data["batch_sizes"]), tuple(data["steps_per_second"]))


def profile_sps(
    step_fn: Callable[[int], None],
    batch_sizes: Sequence[int],
    repeats: int = 5,
    warmup: int = 2,
    *,
    synchronize: Callable[[], None] | None = None,
    timer: Callable[[], float] = time.perf_counter,
) -> SPSCurve:
    """Time ``step_fn(B)`` (one target verify forward over ``B`` tokens) at each batch size.

    Each size gets ``warmup`` untimed calls, then ``repeats`` timed ones; the median time is
    kept (robust to a stray slow call). ``synchronize`` (for example ``torch.cuda.synchronize``)
    runs before reading the clock so asynchronous device work is counted.
    """
    sizes = sorted({int(b) for b in batch_sizes})
    if not sizes or sizes[0] < 1:
        raise ValueError("batch_sizes must be non-empty and all >= 1")
    if repeats < 1 or warmup < 0:
        raise ValueError("repeats must be >= 1 and warmup >= 0")
    sync = synchronize if synchronize is not None else (lambda: None)
    rates: list[float] = []
    for b in sizes:
        for _ in range(warmup):
            step_fn(b)
        sync()
        times: list[float] = []
        for _ in range(repeats):
            start = timer()
            step_fn(b)
            sync()
            times.append(timer() - start)
        rates.append(1.0 / max(statistics.median(times), 1e-9))
    return SPSCurve(tuple(sizes), tuple(rates))
