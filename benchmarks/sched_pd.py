"""Figure 3: disaggregated against colocated goodput under a TTFT + TPOT SLO across loads.

Run:  .venv/bin/python benchmarks/sched_pd.py --requests 3000 --instances 8 \\
          --rates 0.5 1 1.5 2 --plot benchmarks/results/sched_pd_goodput.png

Same instances, same trace, same router (``cost``), shared SSD prefix tier. Colocated
instances mix prefill chunks into decode iterations; disaggregated splits the cluster P:D
(``--split``, or the planner's choice when omitted: ``plan_pd_ratio`` on the trace at each
load) and pays the KV transfer. ``per_request`` prefills short uncached parts on the decode
instance.
"""

from __future__ import annotations

import argparse
import json

from deepinfer_sched.costmodel import RooflineCostModel, load_hardware, load_model
from deepinfer_sched.policies import BatchConfig, SchedulerConfig, WorkloadSummary, plan_pd_ratio
from deepinfer_sched.sim import SimConfig, simulate
from deepinfer_sched.traces import SyntheticTraceConfig, synthetic_trace


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=3000)
    ap.add_argument("--instances", type=int, default=8)
    ap.add_argument("--rates", type=float, nargs="+", default=[0.5, 1.0, 1.5, 2.0])
    ap.add_argument("--split", type=int, default=None, help="prefill instances (else planned)")
    ap.add_argument("--ttft", type=float, default=4.0)
    ap.add_argument("--tpot", type=float, default=0.04)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--plan-hit-rate",
        type=float,
        default=None,
        help="hit rate the planner assumes (default: the trace's reusable fraction)",
    )
    ap.add_argument("--plot", default=None)
    ap.add_argument(
        "--workload",
        choices=("short", "chat77k"),
        default="short",
        help="short: single-turn ~2.5k-token prompts (DistServe-like, little reuse); "
        "chat77k: the default synthetic chat/agent trace (77k mean input, ~96%% reusable)",
    )
    args = ap.parse_args()
    hw, model = "h200", "dense-8b"
    cm = RooflineCostModel(load_hardware(hw), load_model(model))
    kv_cap = cm.kv_capacity_tokens(0.9)
    series: dict[str, list[tuple[float, float]]] = {}
    batch = BatchConfig(max_num_seqs=256, max_batched_tokens=8192)
    for rate in args.rates:
        tcfg = SyntheticTraceConfig(num_requests=args.requests, request_rate=rate, seed=args.seed)
        if args.workload == "short":
            tcfg = SyntheticTraceConfig(
                num_requests=args.requests,
                request_rate=rate,
                seed=args.seed,
                agent_fraction=0.0,
                chat_mean_turns=1.0,
                num_system_prompts=4,
                chat_system_tokens=(400.0, 0.3),
                chat_first_tokens=(2000.0, 0.8),
                chat_output_tokens=(300.0, 0.6),
            )
        trace = synthetic_trace(tcfg)
        if args.split is None:
            plan = plan_pd_ratio(
                WorkloadSummary.from_trace(trace), cm, args.instances, args.ttft, args.tpot, kv_cap
            )
            split = plan.num_prefill
        else:
            split = args.split
        modes = {
            "colocated": (SchedulerConfig(router="cost", batch=batch), 0),
            "disaggregated": (
                SchedulerConfig(router="cost", pd="disaggregated", batch=batch),
                split,
            ),
            "per_request": (
                SchedulerConfig(
                    router="cost", pd="per_request", batch=batch, local_prefill_tokens=1024
                ),
                split,
            ),
        }
        for name, (sched, n_pre) in modes.items():
            cfg = SimConfig(
                scheduler=sched,
                num_instances=args.instances,
                num_prefill=n_pre,
                hardware=hw,
                model=model,
                ssd_capacity_blocks=50_000_000,
                ttft_slo_s=args.ttft,
                tpot_slo_s=args.tpot,
            )
            rep = simulate(trace, cfg, args.seed)
            row = {
                "rate": rate,
                "mode": name,
                "prefill:decode": f"{n_pre}:{args.instances - n_pre}" if n_pre else "-",
                "goodput_rps": round(rep.goodput_rps, 3),
                "attainment": round(rep.slo_attainment, 3),
                "ttft_p90": round(rep.ttft_s.p90, 2),
                "tpot_p90": round(rep.tpot_s.p90, 4),
                "hit_rate": round(rep.hit_rate, 3),
            }
            series.setdefault(name, []).append((rate, rep.goodput_rps))
            print(json.dumps(row), flush=True)
    if args.plot:
        from deepinfer_sched.report.plots import plot_goodput_vs_load

        plot_goodput_vs_load(series, args.plot)


if __name__ == "__main__":
    main()
