"""Synthetic trace generation speed and statistics (deepinfer_sched.traces).

Run: .venv/bin/python benchmarks/bench_sched_traces.py --num-requests 1000000
Prints wall and CPU time of generation and of ``Trace.stats()``, peak RSS, and the trace statistics
(mean input length, reusable-token fraction, realised request rate).
"""

from __future__ import annotations

import argparse
import resource
import time

from deepinfer_sched.traces import SyntheticTraceConfig, synthetic_trace


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--num-requests", type=int, default=100_000)
    ap.add_argument("--block-size", type=int, default=512)
    ap.add_argument("--request-rate", type=float, default=10.0)
    ap.add_argument("--arrival", default="poisson")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    cfg = SyntheticTraceConfig(
        num_requests=args.num_requests,
        block_size=args.block_size,
        request_rate=args.request_rate,
        arrival=args.arrival,
        seed=args.seed,
    )
    t0, c0 = time.perf_counter(), time.process_time()
    trace = synthetic_trace(cfg)
    t1, c1 = time.perf_counter(), time.process_time()
    stats = trace.stats()
    t2, c2 = time.perf_counter(), time.process_time()
    rss_gib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    print(f"requests            {len(trace)}")
    # CPU seconds are reported next to wall seconds: on a shared machine the wall clock
    # mostly measures the neighbours.
    print(f"generate_wall_s     {t1 - t0:.2f}")
    print(f"generate_cpu_s      {c1 - c0:.2f}")
    print(f"stats_wall_s        {t2 - t1:.2f}")
    print(f"stats_cpu_s         {c2 - c1:.2f}")
    print(f"peak_rss_gib        {rss_gib:.2f}")
    print(f"mean_input_len      {stats.mean_input_len:.0f}")
    print(f"mean_output_len     {stats.mean_output_len:.0f}")
    print(f"reusable_fraction   {stats.reusable_fraction:.4f}")
    print(f"request_rate        {stats.request_rate:.3f}")
    print(f"conversations       {stats.num_conversations}")
    print(f"kinds               {stats.kinds}")


if __name__ == "__main__":
    main()
