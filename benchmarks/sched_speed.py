"""Figure 1: simulator speed on the synthetic trace and a 64-instance cluster.

Run:  .venv/bin/python benchmarks/sched_speed.py --requests 100000 --instances 64

Prints wall seconds for trace generation and for the simulation, events, and the
extrapolated time for 1M requests (simulation cost is linear in requests at a fixed load per
instance, so the per-request time measured here carries over).
"""

from __future__ import annotations

import argparse
import json
import resource
import time

from deepinfer_sched.policies import SchedulerConfig
from deepinfer_sched.report import SLO
from deepinfer_sched.sim import SimConfig, Simulator
from deepinfer_sched.traces import SyntheticTraceConfig, synthetic_trace


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=100_000)
    ap.add_argument("--instances", type=int, default=64)
    ap.add_argument("--rate-per-instance", type=float, default=0.12)
    ap.add_argument("--router", default="power_of_two")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rate = args.rate_per_instance * args.instances
    t0 = time.perf_counter()
    trace = synthetic_trace(
        SyntheticTraceConfig(num_requests=args.requests, request_rate=rate, seed=args.seed)
    )
    t_trace = time.perf_counter() - t0
    cfg = SimConfig(
        scheduler=SchedulerConfig(router=args.router),
        num_instances=args.instances,
        hardware="h200",
        model="dense-8b",
        ssd_capacity_blocks=50_000_000,
        ttft_slo_s=5.0,
        tpot_slo_s=0.1,
    )
    cpu0 = time.process_time()
    t0 = time.perf_counter()
    res = Simulator(trace, cfg, args.seed).run()
    t_sim = time.perf_counter() - t0
    cpu_sim = time.process_time() - cpu0
    rep = res.report(SLO(cfg.ttft_slo_s, cfg.tpot_slo_s), cfg.hit_price, cfg.miss_price)
    out = {
        "requests": args.requests,
        "instances": args.instances,
        "router": args.router,
        "offered_rps": rate,
        "trace_gen_s": round(t_trace, 2),
        "sim_wall_s": round(t_sim, 2),
        "sim_cpu_s": round(cpu_sim, 2),
        "events": res.events,
        "us_per_request_cpu": round(cpu_sim / args.requests * 1e6, 1),
        "extrapolated_1M_sim_cpu_s": round(cpu_sim / args.requests * 1e6, 1),
        "simulated_s": round(rep.duration_s, 1),
        "throughput_rps": round(rep.throughput_rps, 3),
        "hit_rate": round(rep.hit_rate, 4),
        "slo_attainment": round(rep.slo_attainment, 4),
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024,
    }
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
