"""Deterministic discrete-event cluster simulator for the scheduling policies."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from deepinfer_sched.costmodel import CostModel
from deepinfer_sched.report import SLO, Report
from deepinfer_sched.sim.config import Fault, InstanceType, SimConfig, SpecDecodeConfig
from deepinfer_sched.sim.engine import SimResult, Simulator
from deepinfer_sched.sim.prefix_cache import LRUBlockCache
from deepinfer_sched.traces.types import Trace

__all__ = [
    "Fault",
    "InstanceType",
    "LRUBlockCache",
    "SimConfig",
    "SimResult",
    "Simulator",
    "SpecDecodeConfig",
    "run_simulation",
    "simulate",
]


def run_simulation(
    trace: Trace,
    config: SimConfig,
    seed: int = 0,
    cost_model: CostModel | Sequence[CostModel] | None = None,
    progress: Callable[[int], None] | None = None,
) -> SimResult:
    """Simulate ``trace`` on the cluster ``config`` describes; raw records and counters."""
    return Simulator(trace, config, seed, cost_model).run(progress)


def simulate(
    trace: Trace,
    config: SimConfig,
    seed: int = 0,
    cost_model: CostModel | Sequence[CostModel] | None = None,
) -> Report:
    """Simulate and summarise under ``config``'s SLO and prices (same seed, same report)."""
    res = run_simulation(trace, config, seed, cost_model)
    slo = SLO(config.ttft_slo_s, config.tpot_slo_s)
    return res.report(slo, config.hit_price, config.miss_price)
