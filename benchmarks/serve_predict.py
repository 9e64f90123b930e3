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
   block hashes, and completion lengths - no measured time of that run. The predicted
   goodput is the mean over step times x ``1 +- --speed-spread`` (`serve_sim.predict_band`:
   near the SLO a closed loop is chaotic, and one speed is one draw of it).

Both sides count goodput through `deepinfer_sched.report.run_goodput`: requests within both
SLOs per second from the workload's time zero to the last request's end. A fixed speed probe
runs before and after every run (other prompts after: the first ones are cached by then).

Prints and writes ``<out>/serve_predict.md`` / ``.json``: measured and predicted goodput per
router and seed, the ratio, its range over seeds, and the pooled ratio per router (mean
predicted over mean measured goodput across the held-out seeds: the headline figure).
``--from FILE --refit`` predicts a saved run again with today's fit of its saved calibration
steps.
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

from deepinfer_sched.costmodel import FittedCostModel, fit_profile, load_profile, merge_profiles


def run(
    args: argparse.Namespace, router: str, seed: int, profile_dir: str | None
) -> dict[str, Any]:
    """One live run of the workload with ``seed``: client records, the workload, and (with
    ``profile_dir``) the replicas' live profiles."""
    wargs = argparse.Namespace(**{**vars(args), "seed": seed})
    convs = serve_load.build_workload(wargs)
    prompts: dict[tuple[int, int], list[dict[str, str]]] = {}
    clock: list[float] = []
    probe: list[float] = []
    after: list[float] = []
    profile = os.path.join(profile_dir, f"{router}-s{seed}.json") if profile_dir else None
    with (
        tempfile.TemporaryDirectory() as cache,
        serve_load.server(wargs, router, args.replicas, cache, profile) as base,
    ):
        records, wall = asyncio.run(
            serve_load.replay(base, convs, args.max_tokens, prompts, clock, probe, after)
        )
    files = []
    if profile:
        root, ext = os.path.splitext(profile)
        files = [f"{root}-replica-{i}{ext}" for i in range(args.replicas)]
    return {
        "router": router,
        "seed": seed,
        "records": records,
        "wall": wall,
        "prompts": prompts,
        "convs": convs,
        "t0": clock[0],
        "profiles": files,
        "load_average": os.getloadavg()[0],
        "probe_s": sorted(probe)[len(probe) // 2],
        "probe_after_s": sorted(after)[len(after) // 2],
    }


def run_speed(run: dict[str, Any]) -> float | None:
    """A run's probe seconds: the mean of the probes before and after it (one probe is a
    point sample that a load peak can move), or the one before for runs saved without."""
    before, after = run.get("probe_s"), run.get("probe_after_s")
    if before and after:
        return float(before + after) / 2.0
    return float(before) if before else None


STEP_KINDS = ("lone decode", "batched decode", "prefill", "prefill after a hit", "mixed")


def step_kind(step: dict[str, Any]) -> str:
    if not step["prefill"]:
        return STEP_KINDS[0] if step["batch_size"] == 1 else STEP_KINDS[1]
    if step["batch_size"]:
        return STEP_KINDS[4]
    return STEP_KINDS[3] if any(c for _, c in step["prefill"]) else STEP_KINDS[2]


def step_charge(cm: FittedCostModel, step: dict[str, Any]) -> float:
    """What the simulator charges for one live-profile step (`Instance.plan_iteration`: each
    chunk's and the decode step's time, the per-step cost once)."""
    terms = [cm.prefill_time(n, c) for n, c in step["prefill"]]
    if step["batch_size"]:
        terms.append(cm.decode_step_time(step["batch_size"], step["context_tokens"]))
    return sum(terms) - (len(terms) - 1) * cm.step_overhead_s


def kind_table(cm: FittedCostModel, groups: list[tuple[str, list[dict[str, Any]]]]) -> list[str]:
    """Charged over measured seconds per kind of step, for each group of live steps (the
    calibration runs', each held-out run's): where the fit is off, by kind."""
    lines = [
        "| steps of | all: charged / measured (s measured) | " + " | ".join(STEP_KINDS) + " |",
        "|---|---|" + "---|" * len(STEP_KINDS),
    ]
    for name, steps in groups:
        sums: dict[str, list[float]] = {k: [0, 0.0, 0.0] for k in STEP_KINDS}
        for st in steps:
            row = sums[step_kind(st)]
            row[0] += 1
            row[1] += st["seconds"]
            row[2] += step_charge(cm, st)
        measured = sum(v[1] for v in sums.values())
        charged = sum(v[2] for v in sums.values())
        cells = [
            f"x{v[2] / v[1]:.2f} ({v[0]:.0f})" if v[0] and v[1] > 0 else "-" for v in sums.values()
        ]
        total = f"x{charged / measured:.2f} ({measured:.1f})" if measured > 0 else "-"
        lines.append(f"| {name} | {total} | " + " | ".join(cells) + " |")
    return lines


def _tpots(records: list[Any]) -> list[float]:
    ok = [x for x in records if x.error is None and x.e2e is not None and x.ttft is not None]
    return sorted((x.e2e - x.ttft) / max(1, x.completion_tokens - 1) for x in ok)


def _pct(values: list[float], q: float) -> float:
    v = sorted(values)
    return v[min(len(v) - 1, int(q * len(v)))]


def compare(
    saved: dict[str, Any],
    cost_model: FittedCostModel,
    overhead: serve_sim.FrontOverhead,
    args: argparse.Namespace,
    probe_ref: float | None = None,
) -> dict[str, Any]:
    """Measured figures of one saved held-out run at ``args``' SLO, and its prediction;
    with ``probe_ref`` (the calibration runs' probe, s) also the prediction with the cost
    model rescaled by this run's probe over it (the machine's speed since calibrating)."""
    records = [serve_load.Record(**r) for r in saved["records"]]
    wargs = argparse.Namespace(**{**vars(args), "seed": saved["seed"]})
    m = serve_load.summarize(saved["router"], records, saved["wall"], wargs)
    turns = {
        int(c): [serve_sim.Turn(n, o, tuple(h), t) for n, o, h, t in ts]
        for c, ts in saved["turns"].items()
    }
    starts = {int(c): float(t) for c, t in saved["starts"].items()}

    def predict(model: Any) -> dict[str, Any]:
        return serve_sim.predict_band(
            turns,
            starts,
            model,
            saved["router"],
            args.replicas,
            wargs,
            overhead,
            spread=args.speed_spread,
            points=args.speed_points,
            cache_publish=args.cache_publish,
        )

    pred = predict(cost_model)
    speed = run_speed(saved)
    if probe_ref and speed:
        pred["probe_scale"] = speed / probe_ref
        pred["sim_goodput_rps_probe"] = predict(cost_model.scaled(pred["probe_scale"]))[
            "sim_goodput_rps"
        ]
    if saved.get("live_profile"):
        # Diagnostic only, never the figure: the same prediction with a model fitted to this
        # run's own steps. Close to measured here but not with the calibration fit means the
        # machine's speed moved between runs; far here too means the model misses something.
        own = fit_profile(saved["live_profile"])
        pred["self_fit_goodput_rps"] = predict(own)["sim_goodput_rps"]
        pred["mean_step_s"] = sum(x["seconds"] for x in saved["live_profile"]["steps"]) / len(
            saved["live_profile"]["steps"]
        )
    tpots = _tpots(records)
    g = m["goodput_rps"]
    row = {
        "router": saved["router"],
        "seed": saved["seed"],
        "goodput_rps": g,
        "slo_attainment": m["slo_attainment"],
        "ttft_p50": m["ttft_p50"],
        "tpot_p50": tpots[len(tpots) // 2] if tpots else None,
        "prefix_hit_rate": m["prefix_hit_rate"],
        "errors": m["errors"],
        "load_average": saved["load_average"],
        "window_s": m["window_s"],
        **{k: v for k, v in pred.items() if k != "sim_requests"},
        "ratio": pred["sim_goodput_rps"] / g if g else None,
        "ratio_probe": pred["sim_goodput_rps_probe"] / g
        if g and "sim_goodput_rps_probe" in pred
        else None,
    }
    return row


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
    ap.add_argument(
        "--ttft-slo",
        type=float,
        default=None,
        help="seconds (default: the round robin calibration run's median TTFT, so round "
        "robin misses the SLO at whatever speed the machine runs)",
    )
    ap.add_argument(
        "--tpot-slo",
        type=float,
        default=None,
        help="seconds (default: the round robin calibration run's p90 TPOT)",
    )
    ap.add_argument("--num-blocks", type=int, default=1024)
    ap.add_argument("--max-num-seqs", type=int, default=16)
    ap.add_argument("--threads", type=int, default=1, help="torch threads per replica")
    ap.add_argument(
        "--cache-publish",
        choices=["finish", "prefill"],
        default="finish",
        help="simulated prefix blocks become hits when their request ends (the engine) or "
        "when its prefill completes",
    )
    ap.add_argument(
        "--speed-spread",
        type=float,
        default=0.1,
        help="the prediction is the mean over step times x 1 +- this (serve_sim.predict_band)",
    )
    ap.add_argument("--speed-points", type=int, default=5, help="speeds in that band")
    ap.add_argument(
        "--from",
        dest="saved",
        default=None,
        help="predict the held-out runs saved in this serve_predict.json again (no live runs)",
    )
    ap.add_argument(
        "--refit",
        action="store_true",
        help="with --from: fit the cost model again to the saved calibration steps (today's "
        "fit) instead of using the saved model",
    )
    ap.add_argument("--out", default="out/serve_predict")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.saved:
        doc = json.loads(Path(args.saved).read_text(encoding="utf-8"))
        for key in ("replicas", "num_blocks", "max_num_seqs", "routers", "calib_seed", "seeds"):
            setattr(args, key, doc["args"][key])
        args.ttft_slo = args.ttft_slo or doc["args"]["ttft_slo"]
        args.tpot_slo = args.tpot_slo or doc["args"]["tpot_slo"]
        steps = doc["live_profile"]["steps"]
        doc.setdefault("calibration_mean_step_s", sum(x["seconds"] for x in steps) / len(steps))
        cm = FittedCostModel.from_json(doc["cost_model"])
        if args.refit:
            cm = fit_profile(doc["live_profile"])
            doc["cost_model"] = cm.to_json()
        oh = serve_sim.FrontOverhead(**doc["front_overhead"])
        ref = doc.get("calibration_probe_s")
        rows = [compare(saved, cm, oh, args, ref) for saved in doc["held_out"]]
        write(out, args, rows, {**doc, "args": vars(args)}, doc["wall_s"])
        return
    if args.calib_seed in args.seeds:
        sys.exit("--calib-seed must differ from every held-out --seeds value")
    started = time.perf_counter()
    front = serve_sim.frontend(args.model)

    # 1. calibration runs: live step profiles, the front's overhead, the SLO
    profiles: list[dict[str, Any]] = []
    overheads = []
    calib = []
    with tempfile.TemporaryDirectory() as pdir:
        for router in args.routers:
            r = run(args, router, args.calib_seed, pdir)
            mine = [load_profile(f) for f in r["profiles"]]
            profiles += mine
            overheads.append(serve_sim.front_overhead(r["records"], r["t0"], mine))
            ok = [x for x in r["records"] if x.error is None and x.ttft is not None]
            calib.append(
                {
                    "router": router,
                    "wall_s": r["wall"],
                    "ttft_p50": _pct([x.ttft for x in ok], 0.5),
                    "tpot_p90": _pct(_tpots(r["records"]), 0.9),
                    "steps": sum(len(p["steps"]) for p in mine),
                    "load_average": r["load_average"],
                    "probe_s": r["probe_s"],
                    "probe_after_s": r["probe_after_s"],
                }
            )
            print(f"calibration run: {calib[-1]}", flush=True)
    cost_model = fit_profile(merge_profiles(profiles))
    overhead = serve_sim.FrontOverhead(
        *(
            sorted(getattr(o, f) for o in overheads)[len(overheads) // 2]
            for f in asdict(overheads[0])
        )
    )
    base = next((c for c in calib if c["router"] == "round_robin"), calib[0])
    args.ttft_slo = args.ttft_slo or round(base["ttft_p50"], 2)
    args.tpot_slo = args.tpot_slo or round(base["tpot_p90"], 2)
    print(f"cost model: {cost_model.prefill_coef} {cost_model.decode_coef} {cost_model.fit_error}")
    print(f"front overhead: {overhead}; SLO TTFT {args.ttft_slo} s, TPOT {args.tpot_slo} s")
    probes = sorted(s for s in map(run_speed, calib) if s)
    probe_ref = probes[len(probes) // 2]

    # 2-3. held-out runs and their predictions
    held_out, rows = [], []
    for seed in args.seeds:
        for router in args.routers:
            with tempfile.TemporaryDirectory() as pdir:
                r = run(args, router, seed, pdir)
                own = merge_profiles([load_profile(f) for f in r["profiles"]])
            users = {i: c.user for i, c in enumerate(r["convs"])}
            turns = serve_sim.workload_turns(r["records"], r["prompts"], users, front)
            saved = {
                "router": router,
                "seed": seed,
                "wall": r["wall"],
                "load_average": r["load_average"],
                "probe_s": r["probe_s"],
                "probe_after_s": r["probe_after_s"],
                "records": [asdict(x) for x in r["records"]],
                "turns": {
                    c: [[t.input_len, t.output_len, list(t.block_hashes), t.tenant] for t in ts]
                    for c, ts in turns.items()
                },
                "starts": {i: c.start_s for i, c in enumerate(r["convs"])},
                "live_profile": own,  # diagnostics only (see compare)
            }
            held_out.append(saved)
            rows.append(compare(saved, cost_model, overhead, args, probe_ref))
            print(json.dumps(rows[-1], default=str), flush=True)
    doc = {
        "cost_model": cost_model.to_json(),
        "front_overhead": asdict(overhead),
        "calibration_runs": calib,
        "calibration_probe_s": probe_ref,
        "live_profile": merge_profiles(profiles),
        "calibration_mean_step_s": sum(x["seconds"] for p in profiles for x in p["steps"])
        / sum(len(p["steps"]) for p in profiles),
        "held_out": held_out,
    }
    write(out, args, rows, doc, time.perf_counter() - started)


def self_ratio(r: dict[str, Any]) -> float | None:
    own, g = r.get("self_fit_goodput_rps"), r["goodput_rps"]
    return own / g if own is not None and g else None


def write(
    out: Path,
    args: argparse.Namespace,
    rows: list[dict[str, Any]],
    doc: dict[str, Any],
    wall: float,
) -> None:
    def f(v: Any, n: int = 3) -> str:
        return "-" if v is None else f"{v:.{n}f}"

    fit = json.loads(doc["cost_model"])
    lines = [
        f"Held-out protocol, {args.replicas} replicas, SLO TTFT <= {args.ttft_slo} s and "
        f"TPOT <= {args.tpot_slo} s; calibrated on seed {args.calib_seed}, predicted seeds "
        f"{args.seeds}; simulated cache publish: {args.cache_publish}; predicted = mean over "
        f"step times x {', '.join(f'{x:.3g}' for x in serve_sim.speed_factors(args.speed_spread, args.speed_points))}"
        f" (band: their range); {wall:.0f} s end to end.",
        "",
        "| router | seed | measured goodput req/s | predicted (band) | predicted / measured | "
        "TTFT p50 measured / predicted s | TPOT p50 measured / predicted s | "
        "prefix hit measured / predicted | load avg | mean step s (calibration: "
        f"{doc.get('calibration_mean_step_s', 0):.2f}) | self-fit / measured (diagnostic) | "
        "probe scale | predicted x probe / measured |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        band = r.get("sim_goodput_band")
        pred = f(r["sim_goodput_rps"]) + (f" ({band[0]:.2f}-{band[1]:.2f})" if band else "")
        lines.append(
            f"| {r['router']} | {r['seed']} | {f(r['goodput_rps'])} | {pred} | "
            f"{f(r['ratio'], 2)} | {f(r['ttft_p50'], 2)} / {f(r['sim_ttft_p50'], 2)} | "
            f"{f(r['tpot_p50'], 2)} / {f(r['sim_tpot_p50'], 2)} | {r['prefix_hit_rate']:.0%} / "
            f"{r['sim_prefix_hit_rate']:.0%} | {r['load_average']:.1f} | "
            f"{f(r.get('mean_step_s'), 2)} | {f(self_ratio(r), 2)} | "
            f"{f(r.get('probe_scale'), 2)} | {f(r.get('ratio_probe'), 2)} |"
        )
    lines += [
        "",
        "| router | pooled predicted / measured (mean over seeds) | range over seeds | "
        "pooled, cost model x probe | range x probe | measured goodput / round robin's |",
        "|---|---|---|---|---|---|",
    ]

    def span(key: str, router: str) -> str:
        v = [r[key] for r in rows if r["router"] == router and r.get(key) is not None]
        return f"{min(v):.2f}-{max(v):.2f}" if v else "-"

    def pooled(key: str, router: str) -> str:
        mine = [r for r in rows if r["router"] == router and r.get(key) is not None]
        measured = sum(r["goodput_rps"] for r in mine)
        return f"{sum(r[key] for r in mine) / measured:.2f}" if mine and measured else "-"

    rr = {r["seed"]: r["goodput_rps"] for r in rows if r["router"] == "round_robin"}
    for router in args.routers:
        gains = [
            r["goodput_rps"] / rr[r["seed"]]
            for r in rows
            if r["router"] == router and rr.get(r["seed"])
        ]
        gain = f"{min(gains):.2f}-{max(gains):.2f}" if gains else "-"
        lines.append(
            f"| {router} | {pooled('sim_goodput_rps', router)} | {span('ratio', router)} | "
            f"{pooled('sim_goodput_rps_probe', router)} | {span('ratio_probe', router)} | {gain} |"
        )
    groups = [("calibration runs", doc["live_profile"]["steps"])] + [
        (f"{h['router']} seed {h['seed']}", h["live_profile"]["steps"])
        for h in doc.get("held_out", ())
        if h.get("live_profile")
    ]
    lines += ["", "Steps charged by the calibrated fit over their measured time, per kind (count):"]
    lines += ["", *kind_table(FittedCostModel.from_json(doc["cost_model"]), groups)]
    lines += [
        "",
        f"Live fit: prefill {fit['prefill_coef']}, decode {fit['decode_coef']}, per cached "
        f"token {fit.get('cached_coef', 0.0)}, "
        f"{json.dumps(fit['fit_error'])}; front overhead (s): "
        f"{json.dumps(doc['front_overhead'])}; calibration runs: "
        f"{json.dumps(doc['calibration_runs'])}",
    ]
    text = "\n".join(lines) + "\n"
    (out / "serve_predict.md").write_text(text, encoding="utf-8")
    full = {**doc, "args": vars(args), "rows": rows, "wall_s": wall}
    (out / "serve_predict.json").write_text(json.dumps(full, default=str), encoding="utf-8")
    print(text)


if __name__ == "__main__":
    main()
