"""Held-out prediction of live `deepinfer serve` runs by the simulator, end to end.

    .venv/bin/python benchmarks/serve_predict.py            # the protocol below, ~10 min

The protocol (nothing measured on a predicted run feeds its prediction):

1. Calibration runs: the workload with ``--calib-seed``, once per router, each server's
   replicas recording the steps they serve (``deepinfer serve --profile-out``). One cost
   model is fitted to all those steps (``deepinfer-sched calibrate`` on the files), and the
   HTTP front's overhead per request (`serve_sim.FrontOverhead`: client send -> replica,
   replica -> client) is measured on the same runs.
2. Held-out runs: the workload with each of ``--seeds`` (different conversations, prompts and
   arrival times), once per router, measured from the client.
3. Prediction: the simulator runs each held-out workload closed-loop
   (`serve_sim.predict_closed_loop`: a conversation's next turn arrives when its simulated
   previous turn ended) with the calibrated cost model, the same router, replica count,
   batch limits and SLO; it sees the workload's conversation start times, prompt tokens and
   block hashes, and completion lengths - no measured time of that run.

Prints and writes ``<out>/serve_predict.md`` / ``.json``: measured and predicted goodput per
router and seed, the ratio, and its range per router.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import serve_load
import serve_sim

from deepinfer_sched.costmodel import fit_profile, load_profile, merge_profiles


def run(
    args: argparse.Namespace, router: str, seed: int, profile_dir: str | None
) -> dict[str, Any]:
    """One live run of the workload with ``seed``: client records, summary, the workload."""
    wargs = argparse.Namespace(**{**vars(args), "seed": seed})
    convs = serve_load.build_workload(wargs)
    prompts: dict[tuple[int, int], list[dict[str, str]]] = {}
    clock: list[float] = []
    profile = os.path.join(profile_dir, f"{router}-s{seed}.json") if profile_dir else None
    with (
        tempfile.TemporaryDirectory() as cache,
        serve_load.server(wargs, router, args.replicas, cache, profile) as base,
    ):
        records, wall = asyncio.run(serve_load.replay(base, convs, args.max_tokens, prompts, clock))
    summary = serve_load.summarize(router, records, wall, wargs)
    summary["load_average"] = os.getloadavg()[0]
    files = []
    if profile:
        root, ext = os.path.splitext(profile)
        files = [f"{root}-replica-{i}{ext}" for i in range(args.replicas)]
    return {
        "records": records,
        "prompts": prompts,
        "convs": convs,
        "t0": clock[0],
        "summary": summary,
        "profiles": files,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="GGUF/model dir (default: embedded SmolLM2)")
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--routers", nargs="+", default=["round_robin", "prefix_affinity", "cost"])
    ap.add_argument("--calib-seed", type=int, default=1)
    ap.add_argument("--seeds", type=int, nargs="+", default=[2, 3], help="held-out workloads")
    ap.add_argument("--conversations", type=int, default=6)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--rate", type=float, default=0.5, help="conversations per second")
    ap.add_argument("--system-prompts", type=int, default=2)
    ap.add_argument("--system-words", type=int, default=150)
    ap.add_argument("--tool-words", type=int, default=20)
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--ttft-slo", type=float, default=10.0)
    ap.add_argument("--tpot-slo", type=float, default=1.5)
    ap.add_argument("--num-blocks", type=int, default=1024)
    ap.add_argument("--max-num-seqs", type=int, default=16)
    ap.add_argument("--threads", type=int, default=1, help="torch threads per replica")
    ap.add_argument("--out", default="out/serve_predict")
    args = ap.parse_args()
    if args.calib_seed in args.seeds:
        sys.exit("--calib-seed must differ from every held-out --seeds value")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    front = serve_sim.frontend(args.model)

    # 1. calibration runs: live step profiles and the front's overhead
    profiles: list[dict[str, Any]] = []
    overheads = []
    calib_rows = []
    with tempfile.TemporaryDirectory() as pdir:
        for router in args.routers:
            r = run(args, router, args.calib_seed, pdir)
            mine = [load_profile(f) for f in r["profiles"]]
            profiles += mine
            overheads.append(serve_sim.front_overhead(r["records"], r["t0"], mine))
            calib_rows.append(r["summary"])
            print(f"calibration run {router}: {json.dumps(r['summary'], default=str)[:300]}")
    cost_model = fit_profile(merge_profiles(profiles))
    (out / "costmodel_live.json").write_text(cost_model.to_json(), encoding="utf-8")
    overhead = serve_sim.FrontOverhead(
        *(
            sorted(getattr(o, f) for o in overheads)[len(overheads) // 2]
            for f in asdict(overheads[0])
        )
    )
    print(f"cost model: {cost_model.prefill_coef} {cost_model.decode_coef} {cost_model.fit_error}")
    print(f"front overhead: {overhead}")

    # 2-3. held-out runs and their predictions
    rows = []
    for seed in args.seeds:
        for router in args.routers:
            r = run(args, router, seed, None)
            users = {i: c.user for i, c in enumerate(r["convs"])}
            turns = serve_sim.workload_turns(r["records"], r["prompts"], users, front)
            starts = {i: c.start_s for i, c in enumerate(r["convs"])}
            wargs = argparse.Namespace(**{**vars(args), "seed": seed})
            pred = serve_sim.predict_closed_loop(
                turns, starts, cost_model, router, args.replicas, wargs, overhead
            )
            m = r["summary"]
            row = {
                "router": router,
                "seed": seed,
                **{k: m[k] for k in ("goodput_rps", "slo_attainment", "ttft_p50", "ttft_p90")},
                "itl_p50": m["itl_p50"],
                "prefix_hit_rate": m["prefix_hit_rate"],
                "errors": m["errors"],
                "load_average": m["load_average"],
                **pred,
            }
            ok = [x for x in r["records"] if x.error is None and x.e2e is not None and x.ttft]
            tpots = sorted((x.e2e - x.ttft) / max(1, x.completion_tokens - 1) for x in ok)
            row["tpot_p50"] = tpots[len(tpots) // 2] if tpots else None
            g = m["goodput_rps"]
            row["ratio"] = pred["sim_goodput_rps"] / g if g else None
            rows.append(row)
            print(json.dumps(row, default=str))
    wall = time.perf_counter() - started
    write(out, args, rows, calib_rows, cost_model.fit_error, asdict(overhead), wall)


def write(
    out: Path,
    args: argparse.Namespace,
    rows: list[dict[str, Any]],
    calib: list[dict[str, Any]],
    fit_error: dict[str, float],
    overhead: dict[str, float],
    wall: float,
) -> None:
    def f(v: Any, n: int = 3) -> str:
        return "-" if v is None else f"{v:.{n}f}"

    lines = [
        f"Held-out protocol, {args.replicas} replicas, SLO TTFT <= {args.ttft_slo} s and "
        f"TPOT <= {args.tpot_slo} s; calibrated on seed {args.calib_seed}, predicted seeds "
        f"{args.seeds}; {wall:.0f} s end to end.",
        "",
        "| router | seed | measured goodput req/s | predicted | predicted / measured | "
        "TTFT p50 measured / predicted s | TPOT p50 measured / predicted s | "
        "prefix hit measured / predicted | load avg |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['router']} | {r['seed']} | {f(r['goodput_rps'])} | {f(r['sim_goodput_rps'])} | "
            f"{f(r['ratio'], 2)} | {f(r['ttft_p50'])} / {f(r['sim_ttft_p50'])} | "
            f"{f(r['tpot_p50'])} / {f(r['sim_tpot_p50'])} | {r['prefix_hit_rate']:.0%} / "
            f"{r['sim_prefix_hit_rate']:.0%} | {r['load_average']:.1f} |"
        )
    lines += ["", "| router | predicted / measured goodput, range over seeds |", "|---|---|"]
    for router in args.routers:
        ratios = [r["ratio"] for r in rows if r["router"] == router and r["ratio"] is not None]
        span = f"{min(ratios):.2f}-{max(ratios):.2f}" if ratios else "-"
        lines.append(f"| {router} | {span} |")
    lines += [
        "",
        f"Live fit: {json.dumps(fit_error)}; front overhead (s): {json.dumps(overhead)}",
    ]
    text = "\n".join(lines) + "\n"
    (out / "serve_predict.md").write_text(text, encoding="utf-8")
    doc = {
        "args": vars(args),
        "rows": rows,
        "calibration_runs": calib,
        "fit_error": fit_error,
        "front_overhead": overhead,
        "wall_s": wall,
    }
    (out / "serve_predict.json").write_text(
        json.dumps(doc, indent=1, default=str), encoding="utf-8"
    )
    print(text)


if __name__ == "__main__":
    main()
