"""SLO-driven autoscaling on a trace with a daily load swing, against fixed fleets.

Replays Poisson arrivals (lognormal prompts/outputs, dense-8b on H800 via the roofline)
whose rate swings by +-``amplitude`` over a compressed "day", once with the
:class:`~deepinfer_sched.policies.SLOAutoscaler` and once per fixed fleet size, and reports
instance-hours against the smallest fixed fleet reaching the autoscaled SLO attainment.

    python benchmarks/sched_autoscale.py --requests 20000 --rate 12 --day-s 1800 \\
        --out benchmarks/results/sched_autoscale.md
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from deepinfer_sched.costmodel import RooflineCostModel, load_hardware, load_model
from deepinfer_sched.policies import AutoscaleConfig, SchedulerConfig
from deepinfer_sched.report import SLO
from deepinfer_sched.sim import SimConfig, SimResult, run_simulation
from deepinfer_sched.traces import Trace, TraceRequest, daily_swing

TTFT, TPOT = 1.0, 0.03


def swing_trace(n: int, rate: float, day_s: float, amplitude: float, seed: int = 0) -> Trace:
    """``n`` requests at mean ``rate`` whose rate follows one sine period per ``day_s``."""
    rng = np.random.default_rng(seed)
    t = daily_swing(np.cumsum(rng.exponential(1.0 / rate, n)), day_s, amplitude, -np.pi / 2)
    inp = np.clip(rng.lognormal(np.log(3000), 0.5, n), 64, 30_000).astype(int)
    out = np.clip(rng.lognormal(np.log(300), 0.5, n), 2, 3000).astype(int)
    reqs = (TraceRequest(i, float(t[i]), int(inp[i]), int(out[i]), ()) for i in range(n))
    return Trace(tuple(reqs), 512, "daily-swing")


def run(trace: Trace, n: int, auto: AutoscaleConfig | None) -> SimResult:
    cm = RooflineCostModel(load_hardware("h800"), load_model("dense-8b"))
    cfg = SimConfig(
        SchedulerConfig(router="least_loaded"),
        num_instances=n,
        ttft_slo_s=TTFT,
        tpot_slo_s=TPOT,
        autoscale=auto,
        sample_interval_s=0.0,
    )
    return run_simulation(trace, cfg, 0, cost_model=cm)


def capacity_per_instance(target: float = 0.95) -> float:
    """Highest steady Poisson rate one instance serves at ``target`` attainment (bisection
    on short simulations): the per-instance capacity the autoscaler plans with."""
    slo = SLO(TTFT, TPOT)
    lo, hi = 0.1, 50.0
    for _ in range(10):
        mid = (lo * hi) ** 0.5
        tr = swing_trace(1500, mid, 1e9, 0.0, seed=7)
        if run(tr, 1, None).report(slo, 1.0, 1.0).slo_attainment >= target:
            lo = mid
        else:
            hi = mid
    return lo


def compare(
    trace: Trace, max_instances: int, auto: AutoscaleConfig
) -> tuple[SimResult, list[tuple[int, float, float]]]:
    slo = SLO(TTFT, TPOT)
    scaled = run(trace, max_instances, auto)
    fixed = []
    for n in range(1, max_instances + 1):
        res = run(trace, n, None)
        fixed.append((n, res.report(slo, 1.0, 1.0).slo_attainment, res.instance_seconds))
    return scaled, fixed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=20_000)
    ap.add_argument("--rate", type=float, default=12.0, help="mean requests/s")
    ap.add_argument("--day-s", type=float, default=1800.0, help="seconds per simulated day")
    ap.add_argument("--amplitude", type=float, default=0.8)
    ap.add_argument("--max-instances", type=int, default=12)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    trace = swing_trace(args.requests, args.rate, args.day_s, args.amplitude)
    t0 = time.perf_counter()
    cap = capacity_per_instance()
    auto = AutoscaleConfig(
        target=0.95,
        window_s=60,
        interval_s=15,
        cooldown_s=60,
        startup_s=30,
        initial=2,
        capacity_rps=round(cap, 3),
    )
    scaled, fixed = compare(trace, args.max_instances, auto)
    wall = time.perf_counter() - t0
    slo = SLO(TTFT, TPOT)
    att = scaled.report(slo, 1.0, 1.0).slo_attainment
    sizes = [s for _, s in scaled.fleet_size]
    match = next(((n, a, s) for n, a, s in fixed if a >= att), fixed[-1])
    lines = [
        "# deepinfer_sched: SLO autoscaling on a daily swing",
        "",
        f"Trace: {args.requests} requests, mean {args.rate} req/s, rate x (1 +- "
        f"{args.amplitude}) over a {args.day_s:.0f} s day; dense-8b on H800 (roofline), "
        f"one instance sustains {cap:.2f} req/s at 0.95 attainment (bisection), "
        f"TTFT SLO {TTFT} s, TPOT SLO {TPOT} s, least_loaded routing. Autoscaler: {auto}.",
        "",
        "| fleet | SLO attainment | instance-hours |",
        "|---|---|---|",
        f"| autoscaled (size {min(sizes)}..{max(sizes)}, {len(sizes) - 1} changes) | "
        f"{att:.3f} | {scaled.instance_seconds / 3600:.2f} |",
    ]
    for n, a, s in fixed:
        mark = " (smallest fixed fleet at the autoscaled attainment)" if n == match[0] else ""
        lines.append(f"| fixed {n}{mark} | {a:.3f} | {s / 3600:.2f} |")
    saving = 1.0 - scaled.instance_seconds / match[2]
    lines += [
        "",
        f"Autoscaled instance-hours are {saving:.0%} below the fixed fleet of {match[0]} "
        f"at the same attainment. The capacity bisection and {1 + args.max_instances} "
        f"simulations took {wall:.0f} s.",
        "",
        "Reproduce: `python benchmarks/sched_autoscale.py "
        f"--requests {args.requests} --rate {args.rate} --day-s {args.day_s:g} "
        f"--amplitude {args.amplitude} --max-instances {args.max_instances}`",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
