"""Plot helpers: the CDF math always, the PNG writers when matplotlib is installed."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from deepinfer_sched.report import (
    SLO,
    RequestRecord,
    latency_cdf,
    plot_goodput_vs_load,
    plot_latency_cdf,
)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _records(scale: float) -> list[RequestRecord]:
    recs = [
        RequestRecord(
            i, float(i), i + scale * (i % 7 + 1) / 7, i + 2.0 * scale, 100, 20, 50, False, 0, 1
        )
        for i in range(30)
    ]
    recs.append(RequestRecord(99, 1.0, math.nan, math.nan, 10, 1, 0, True, -1, -1))
    return recs


def test_latency_cdf() -> None:
    x, y = latency_cdf([3.0, 1.0, 2.0, 2.0])
    assert x.tolist() == [1.0, 2.0, 2.0, 3.0]
    assert y.tolist() == [0.25, 0.5, 0.75, 1.0]
    ex, ey = latency_cdf(np.array([]))
    assert ex.size == ey.size == 0


def test_pngs_written(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    cdf = tmp_path / "ttft.png"
    plot_latency_cdf({"rr": _records(1.0), "cost": _records(0.5)}, cdf, "ttft", SLO(1.0, 0.1))
    assert cdf.read_bytes()[:8] == PNG_MAGIC
    tpot = tmp_path / "tpot.png"
    plot_latency_cdf({"rr": _records(1.0)}, tpot, "tpot")
    assert tpot.read_bytes()[:8] == PNG_MAGIC
    good = tmp_path / "goodput.png"
    plot_goodput_vs_load({"rr": [(2.0, 1.5), (1.0, 1.0)], "cost": [(1.0, 1.0), (2.0, 2.0)]}, good)
    assert good.read_bytes()[:8] == PNG_MAGIC


def test_plot_validation(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="metric"):
        plot_latency_cdf({"a": _records(1.0)}, tmp_path / "x.png", "latency")
    with pytest.raises(ValueError, match="at least one"):
        plot_goodput_vs_load({}, tmp_path / "x.png")
    pytest.importorskip("matplotlib")
    with pytest.raises(ValueError, match="no points"):
        plot_goodput_vs_load({"a": []}, tmp_path / "x.png")
