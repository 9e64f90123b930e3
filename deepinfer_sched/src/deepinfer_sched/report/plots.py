"""PNG plots of simulation results. matplotlib is an optional extra (``deepinfer-sched[cli]``)
imported inside the functions; the figure API is used directly, so no global pyplot state."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from deepinfer_sched.report.records import SLO, RequestRecord

__all__ = ["LATENCY_METRICS", "latency_cdf", "plot_goodput_vs_load", "plot_latency_cdf"]

LATENCY_METRICS = ("ttft", "tpot", "e2e")


def _metric(records: Sequence[RequestRecord], metric: str) -> npt.NDArray[np.float64]:
    if metric not in LATENCY_METRICS:
        raise ValueError(f"metric must be one of {LATENCY_METRICS}, got {metric!r}")
    attr = f"{metric}_s"
    return np.array([getattr(r, attr) for r in records if not r.rejected], dtype=np.float64)


def latency_cdf(
    values: Sequence[float] | npt.NDArray[np.float64],
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """Empirical CDF: sorted values ``x`` and ``y_i = (i + 1) / n`` (fraction <= ``x_i``)."""
    x = np.sort(np.asarray(values, dtype=np.float64))
    y = np.arange(1, x.size + 1, dtype=np.float64) / max(x.size, 1)
    return x, y


def _figure() -> Any:
    try:
        from matplotlib.figure import Figure
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("plots need matplotlib: pip install 'deepinfer-sched[cli]'") from e
    return Figure(figsize=(6.0, 4.0), layout="constrained")


def plot_latency_cdf(
    series: Mapping[str, Sequence[RequestRecord]],
    path: str | os.PathLike[str],
    metric: str = "ttft",
    slo: SLO | None = None,
) -> None:
    """One CDF curve of ``metric`` (``ttft``, ``tpot`` or ``e2e``) per labelled run, over
    completed requests, with the SLO target as a dashed line when given; writes a PNG."""
    if not series:
        raise ValueError("series must hold at least one labelled run")
    curves = {label: latency_cdf(_metric(records, metric)) for label, records in series.items()}
    fig = _figure()
    ax = fig.add_subplot()
    for label, (x, y) in curves.items():
        ax.step(x, y, where="post", label=f"{label} (n={x.size})")
    if slo is not None and metric != "e2e":
        ax.axvline(
            slo.ttft_s if metric == "ttft" else slo.tpot_s, color="k", linestyle="--", label="SLO"
        )
    ax.set_xscale("log")
    ax.set_xlabel(f"{metric.upper()} (s)")
    ax.set_ylabel("fraction of requests")
    ax.set_ylim(0.0, 1.0)
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.savefig(os.fspath(path), dpi=120)


def plot_goodput_vs_load(
    series: Mapping[str, Sequence[tuple[float, float]]],
    path: str | os.PathLike[str],
    xlabel: str = "offered load (requests/s)",
    ylabel: str = "goodput (requests/s)",
) -> None:
    """One curve of ``(load, goodput)`` points per labelled policy (sorted by load), plus the
    ``goodput = load`` line an ideal system would follow; writes a PNG."""
    if not series:
        raise ValueError("series must hold at least one labelled curve")
    fig = _figure()
    ax = fig.add_subplot()
    top = 0.0
    for label, points in series.items():
        pts = sorted(points)
        if not pts:
            raise ValueError(f"series {label!r} has no points")
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=label)
        top = max(top, pts[-1][0])
    ax.plot([0.0, top], [0.0, top], color="0.6", linestyle=":", label="ideal")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.savefig(os.fspath(path), dpi=120)
