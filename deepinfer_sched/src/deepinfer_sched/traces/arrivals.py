"""Arrival processes: Poisson, gamma-renewal and two-state MMPP, vectorised with numpy."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

__all__ = ["ARRIVAL_PROCESSES", "arrival_times", "daily_swing"]

ARRIVAL_PROCESSES = ("poisson", "gamma", "mmpp")


def arrival_times(
    rng: np.random.Generator,
    n: int,
    rate: float,
    process: str = "poisson",
    burstiness: float = 4.0,
    dwell_s: float = 60.0,
) -> npt.NDArray[np.float64]:
    """``n`` sorted arrival times (seconds, first gap included) with mean rate ``rate``.

    - ``poisson``: i.i.d. exponential gaps of mean ``1/rate``.
    - ``gamma``: i.i.d. gamma gaps of mean ``1/rate`` and squared coefficient of variation
      ``burstiness`` (shape ``k = 1/burstiness``, scale ``1/(rate k)``); ``burstiness = 1``
      is Poisson, larger values cluster arrivals.
    - ``mmpp``: a two-state Markov-modulated Poisson process; states alternate with
      exponential dwell times of mean ``dwell_s`` and rates ``lo = 2 rate / (1 + b)``,
      ``hi = b lo`` (``b = burstiness``), so the long-run mean rate is ``rate``. Arrivals are
      unit-rate Poisson points in integrated-intensity time ``Lambda(t)`` mapped back
      through ``Lambda^-1``.
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if not rate > 0.0:
        raise ValueError(f"rate must be > 0, got {rate}")
    if n == 0:
        return np.zeros(0, dtype=np.float64)
    if process == "poisson":
        return np.cumsum(rng.exponential(1.0 / rate, size=n))
    if process == "gamma":
        shape = 1.0 / burstiness
        return np.cumsum(rng.gamma(shape, 1.0 / (rate * shape), size=n))
    if process == "mmpp":
        lo = 2.0 * rate / (1.0 + burstiness)
        hi = burstiness * lo
        points = np.cumsum(rng.exponential(1.0, size=n))
        need = float(points[-1])
        # Enough state segments to cover the integrated intensity, grown if short.
        seg = max(16, int(2.0 * need / (rate * dwell_s)) + 16)
        while True:
            durations = rng.exponential(dwell_s, size=seg)
            rates = np.where(np.arange(seg) % 2 == 0, lo, hi)
            if rng.random() < 0.5:
                rates = rates[::-1].copy()
            t_edges = np.concatenate(([0.0], np.cumsum(durations)))
            lam_edges = np.concatenate(([0.0], np.cumsum(durations * rates)))
            if lam_edges[-1] >= need:
                break
            seg *= 2
        return np.asarray(np.interp(points, lam_edges, t_edges), dtype=np.float64)
    raise ValueError(f"process must be one of {ARRIVAL_PROCESSES}, got {process!r}")


def daily_swing(
    times: npt.NDArray[np.float64], period_s: float, amplitude: float, phase: float = 0.0
) -> npt.NDArray[np.float64]:
    """Warp arrival ``times`` of a steady process so the rate follows a daily swing.

    The new rate is ``r (1 + amplitude sin(2 pi t / period_s + phase))`` with ``r`` the
    original mean rate: each time ``t`` maps to ``Lambda^-1(t)`` where ``Lambda`` is the
    swing's integrated intensity (normalised to rate 1), so the count, order and mean rate
    are kept and only the spacing changes. ``amplitude`` in ``[0, 1)``.
    """
    if not period_s > 0:
        raise ValueError(f"period_s must be > 0, got {period_s}")
    if not 0.0 <= amplitude < 1.0:
        raise ValueError(f"amplitude must be in [0, 1), got {amplitude}")
    t = np.asarray(times, dtype=np.float64)
    if t.size == 0:
        return t.copy()
    w = 2.0 * np.pi / period_s
    span = float(t.max()) * 1.05 + period_s
    grid = np.linspace(0.0, span, max(4096, int(64 * span / period_s)))
    lam = grid + amplitude / w * (np.cos(phase) - np.cos(w * grid + phase))
    return np.interp(t, lam, grid)
