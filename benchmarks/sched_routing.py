"""Figure 2: goodput of cache/latency-aware routing against round robin and least loaded.

Run:  .venv/bin/python benchmarks/sched_routing.py --requests 4000 --instances 16 \\
          --rates 1.5 2.5 3.5

Colocated instances (dense-8b on H200), each with a local prefix cache of
``--cache-blocks`` blocks (HBM plus host memory) and no shared SSD tier, so where a
conversation lands decides whether its history is a hit. Goodput = requests/s meeting
TTFT <= ``--ttft`` and TPOT <= ``--tpot``.
"""

from __future__ import annotations

import argparse
import json

from deepinfer_sched.policies import SchedulerConfig
from deepinfer_sched.sim import SimConfig, simulate
from deepinfer_sched.traces import SyntheticTraceConfig, synthetic_trace

ROUTERS = (
    "round_robin",
    "least_loaded",
    "power_of_two",
    "prefix_affinity",
    "cost",
    "ttft_estimate",
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=4000)
    ap.add_argument("--instances", type=int, default=16)
    ap.add_argument("--rates", type=float, nargs="+", default=[1.5, 2.5, 3.5])
    ap.add_argument("--cache-blocks", type=int, default=20_000)
    ap.add_argument("--ttft", type=float, default=5.0)
    ap.add_argument("--tpot", type=float, default=0.1)
    ap.add_argument("--routers", nargs="+", default=list(ROUTERS))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--plot", default=None, help="write a goodput-vs-load PNG here")
    args = ap.parse_args()
    rows = []
    series: dict[str, list[tuple[float, float]]] = {r: [] for r in args.routers}
    for rate in args.rates:
        trace = synthetic_trace(
            SyntheticTraceConfig(num_requests=args.requests, request_rate=rate, seed=args.seed)
        )
        for router in args.routers:
            cfg = SimConfig(
                scheduler=SchedulerConfig(router=router),
                num_instances=args.instances,
                hardware="h200",
                model="dense-8b",
                prefix_cache_blocks=args.cache_blocks,
                ttft_slo_s=args.ttft,
                tpot_slo_s=args.tpot,
            )
            rep = simulate(trace, cfg, args.seed)
            row = {
                "rate": rate,
                "router": router,
                "goodput_rps": round(rep.goodput_rps, 3),
                "attainment": round(rep.slo_attainment, 3),
                "hit_rate": round(rep.hit_rate, 3),
                "ttft_p50": round(rep.ttft_s.p50, 2),
                "ttft_p99": round(rep.ttft_s.p99, 2),
                "tpot_p50": round(rep.tpot_s.p50, 4),
            }
            rows.append(row)
            series[router].append((rate, rep.goodput_rps))
            print(json.dumps(row), flush=True)
    if args.plot:
        from deepinfer_sched.report.plots import plot_goodput_vs_load

        plot_goodput_vs_load(series, args.plot)


if __name__ == "__main__":
    main()
