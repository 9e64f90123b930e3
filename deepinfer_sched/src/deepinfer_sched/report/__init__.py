"""Serving reports: per-request records in, latency percentiles / goodput / cost out.

Example::

    from deepinfer_sched.report import SLO, RequestRecord, build_report

    recs = [RequestRecord(0, 0.0, 0.5, 2.5, 1000, 101, 900, False, 0, 1)]
    rep = build_report(recs, SLO(ttft_s=1.0, tpot_s=0.05), {0: 0.5, 1: 2.0}, 10.0,
                       hit_price=0.1e-6, miss_price=5e-6)
    print(rep.to_json())
"""

from deepinfer_sched.report.build import LatencySummary, Report, TenantSummary, build_report
from deepinfer_sched.report.plots import (
    LATENCY_METRICS,
    latency_cdf,
    plot_goodput_vs_load,
    plot_latency_cdf,
)
from deepinfer_sched.report.records import SLO, RequestRecord
from deepinfer_sched.report.run_goodput import RunGoodput, run_goodput
from deepinfer_sched.report.timeline import Timeline

__all__ = [
    "LATENCY_METRICS",
    "SLO",
    "LatencySummary",
    "Report",
    "RequestRecord",
    "RunGoodput",
    "TenantSummary",
    "Timeline",
    "build_report",
    "latency_cdf",
    "plot_goodput_vs_load",
    "plot_latency_cdf",
    "run_goodput",
]
