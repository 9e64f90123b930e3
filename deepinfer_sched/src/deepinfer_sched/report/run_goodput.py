"""Goodput of one finite run, computed the same way for a measured run and its simulation.

A benchmark that compares the simulator's goodput with a live run's must count the same
requests over the same window on both sides, or a gap in the window reads as a gap in the
prediction. :func:`run_goodput` fixes both: every request is given on the run's own clock
(0 = the workload's time zero, before its first arrival) as ``(sent, ttft, e2e,
output_tokens)`` seen by the client; a request meets the SLO when ``ttft <= SLO.ttft_s`` and
its TPOT ``(e2e - ttft) / max(1, output_tokens - 1)`` is ``<= SLO.tpot_s``; the window runs
from 0 to the last request's end (``sent + e2e``), not to whenever the harness stopped its
clock.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from deepinfer_sched.report.records import SLO

__all__ = ["RunGoodput", "run_goodput"]


@dataclass(frozen=True)
class RunGoodput:
    """``met`` of ``total`` requests met the SLO over ``window_s`` seconds."""

    met: int
    total: int
    window_s: float

    @property
    def goodput_rps(self) -> float:
        return self.met / self.window_s if self.window_s > 0.0 else 0.0

    @property
    def attainment(self) -> float:
        return self.met / self.total if self.total else 0.0


def run_goodput(
    requests: Iterable[tuple[float, float, float, int]], slo: SLO, total: int | None = None
) -> RunGoodput:
    """Goodput of the finished ``requests`` (see the module doc). ``total`` is the number of
    requests the workload sent (default: those given); a request that failed or was rejected
    counts in it but never meets the SLO."""
    met = 0
    done = 0
    end = 0.0
    for i, (sent, ttft, e2e, tokens) in enumerate(requests):
        if not all(math.isfinite(v) for v in (sent, ttft, e2e)) or not 0.0 <= ttft <= e2e:
            raise ValueError(
                f"requests[{i}]: need finite sent and 0 <= ttft <= e2e, got ({sent}, {ttft}, {e2e})"
            )
        if tokens < 1:
            raise ValueError(f"requests[{i}]: output_tokens must be >= 1, got {tokens}")
        done += 1
        end = max(end, sent + e2e)
        if ttft <= slo.ttft_s and (e2e - ttft) / max(1, tokens - 1) <= slo.tpot_s:
            met += 1
    total = done if total is None else total
    if total < done:
        raise ValueError(f"total ({total}) is less than the {done} requests given")
    return RunGoodput(met, total, end)
