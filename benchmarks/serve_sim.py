"""The simulator's prediction of a `serve_load.py` run: the same requests through
`deepinfer_sched` with a cost model fitted to the engine's own step profile.

    OMP_NUM_THREADS=1 deepinfer bench --num-prompts 4 --profile profile.json
    deepinfer-sched calibrate --profile profile.json --out costmodel.json
    python benchmarks/serve_load.py --cost-model costmodel.json ...
    python benchmarks/serve_sim.py out/serve_load/serve_load.json --cost-model costmodel.json

The second form simulates the runs saved in ``serve_load.json`` again (their traces are kept
there), e.g. with ``--scale`` to see how much of a gap is the machine's contention.

`predict_closed_loop` (used by `serve_predict.py`, the held-out protocol) takes nothing from
the run it predicts but its workload: each conversation starts when the workload says, and
each later turn arrives when the SIMULATED previous answer ended (iterated to a fixed point),
with the HTTP front's overhead per request (`FrontOverhead`) measured on the calibration run.

`predict` is the older open-loop replay: each request arrives when the benchmark sent it
(later turns of a conversation were sent when the previous answer had streamed in, so the
simulator replays the live run's arrival times open-loop), with the prompt and completion
lengths the server reported and the prompt's chained block hashes computed exactly as the replicas' prefix caches
do (the tenant namespace folded in), so the simulated prefix caches hit where the live ones
could. The cluster is the server's: ``replicas`` instances with the engine's batch limits and
KV pool, routed by the same router under the same SLO.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deepinfer.engine.config import EngineConfig
from deepinfer.serve.frontend import Frontend, load_frontend
from deepinfer.serve.routing import prompt_hashes
from deepinfer_sched.costmodel import FittedCostModel
from deepinfer_sched.policies import BatchConfig, SchedulerConfig
from deepinfer_sched.report import SLO, run_goodput
from deepinfer_sched.sim import SimConfig, run_simulation
from deepinfer_sched.traces import Trace, TraceRequest


def load_cost_model(path: str | Path, scale: float = 1.0) -> FittedCostModel:
    """A fitted cost model; ``scale`` multiplies every step time (a diagnostic: the share of
    a core each replica really got while the profile ran alone)."""
    cm = FittedCostModel.from_json(Path(path).read_text(encoding="utf-8"))
    return cm if scale == 1.0 else cm.scaled(scale)


def trace_to_json(trace: Trace) -> list[list[Any]]:
    return [
        [r.arrival_s, r.input_len, r.output_len, list(r.block_hashes), r.tenant, r.conversation_id]
        for r in trace.requests
    ]


def trace_from_json(rows: list[list[Any]]) -> Trace:
    block_size = EngineConfig().block_size
    return Trace(
        tuple(
            TraceRequest(i, float(a), int(n), int(o), tuple(int(h) for h in hs), str(t), int(c))
            for i, (a, n, o, hs, t, c) in enumerate(rows)
        ),
        block_size,
    )


def frontend(model: str | None) -> Frontend:
    return load_frontend(model, "bench", None)


def build_trace(
    records: Sequence[Any],
    prompts: Mapping[tuple[int, int], list[dict[str, str]]],
    users: Mapping[int, str],
    front: Frontend,
) -> Trace:
    """The run's finished requests as a trace (arrival order, ids renumbered from 0), cut in
    blocks of the server's block size (``deepinfer serve --block-size``, default 16)."""
    block_size = EngineConfig().block_size
    done = sorted(
        (r for r in records if r.error is None and r.completion_tokens > 0),
        key=lambda r: r.start,
    )
    requests = []
    for i, r in enumerate(done):
        ids = front.render_chat(prompts[(r.conv, r.turn)])
        namespace = b"user:" + users[r.conv].encode("utf-8")
        requests.append(
            TraceRequest(
                request_id=i,
                arrival_s=max(0.0, r.start),
                input_len=len(ids),
                output_len=r.completion_tokens,
                block_hashes=prompt_hashes(ids, block_size, namespace),
                tenant=users[r.conv],
                conversation_id=r.conv,
            )
        )
    return Trace(tuple(requests), block_size)


def predict(
    trace: Trace,
    cost_model: FittedCostModel,
    router: str,
    replicas: int,
    args: argparse.Namespace,
) -> dict[str, Any]:
    """Predicted goodput (requests within both SLOs per second of the run) and TTFT."""
    engine = EngineConfig(num_blocks=args.num_blocks, max_num_seqs=args.max_num_seqs)
    config = SimConfig(
        SchedulerConfig(
            router=router,
            batch=BatchConfig(
                engine.max_num_seqs, engine.max_batched_tokens, engine.chunked_prefill
            ),
        ),
        num_instances=replicas,
        kv_capacity_tokens=engine.num_blocks * engine.block_size,
        ttft_slo_s=args.ttft_slo,
        tpot_slo_s=args.tpot_slo,
    )
    res = run_simulation(trace, config, args.seed, cost_model=cost_model)
    recs = [r for r in res.records if not r.rejected]

    ttfts = sorted(r.first_token_s - r.arrival_s for r in recs)
    good = run_goodput(
        (
            (r.arrival_s, r.first_token_s - r.arrival_s, r.finish_s - r.arrival_s, r.output_len)
            for r in recs
        ),
        SLO(args.ttft_slo, args.tpot_slo),
        total=len(trace.requests),
    )
    prompt = sum(r.input_len for r in recs)
    return {
        "sim_goodput_rps": good.goodput_rps,
        "sim_slo_attainment": good.attainment,
        "sim_wall_s": good.window_s,
        "sim_ttft_p50": ttfts[len(ttfts) // 2] if ttfts else None,
        "sim_ttft_p90": ttfts[min(len(ttfts) - 1, int(0.9 * len(ttfts)))] if ttfts else None,
        "sim_prefix_hit_rate": sum(r.cached_tokens for r in recs) / prompt if prompt else 0.0,
        # (arrival, first token, finish, output tokens) per request: goodput at other SLOs
        "sim_records": [[r.arrival_s, r.first_token_s, r.finish_s, r.output_len] for r in recs],
    }


@dataclass(frozen=True)
class FrontOverhead:
    """Seconds the HTTP front, the pipes and the client add around a replica's own times
    (medians over a calibration run): ``inbound_s`` client send -> the front hands the
    request to a replica (parse, chat template, tokenize, route); ``first_s`` replica's first token ->
    client's first content chunk; ``last_s`` replica finish -> client's last chunk;
    ``think_s`` client's end of one turn -> its next turn sent."""

    inbound_s: float = 0.0
    first_s: float = 0.0
    last_s: float = 0.0
    think_s: float = 0.0


def front_overhead(
    records: Sequence[Any], t0: float, profiles: Sequence[Mapping[str, Any]]
) -> FrontOverhead:
    """Match each finished client record to the replica-side row of the same request (same
    prompt length, queued first after the client sent it) in the live profiles'
    ``requests`` (``[queued, first token, finished, prompt, cached]``, same clock)."""
    rows = sorted(
        (list(r) for p in profiles for r in p.get("requests", ())), key=lambda r: float(r[0])
    )
    used: set[int] = set()
    inbound, first, last, think = [], [], [], []
    ok = [r for r in records if r.error is None and r.ttft is not None and r.e2e is not None]
    for rec in sorted(ok, key=lambda r: r.start):
        sent = t0 + rec.start
        pick = next(
            (
                i
                for i, row in enumerate(rows)
                if i not in used and row[3] == rec.prompt_tokens and sent <= row[0] <= sent + 30
            ),
            None,
        )
        if pick is None:
            continue
        used.add(pick)
        received, first_token, finished = rows[pick][:3]
        inbound.append(received - sent)
        first.append(sent + rec.ttft - first_token)
        last.append(sent + rec.e2e - finished)
    ends = {(r.conv, r.turn): r.start + r.e2e for r in ok}
    for r in ok:
        if (r.conv, r.turn - 1) in ends:
            think.append(r.start - ends[(r.conv, r.turn - 1)])
    if not inbound:
        raise ValueError("no client request matched a replica-side request row")
    return FrontOverhead(
        statistics.median(inbound),
        statistics.median(first),
        statistics.median(last),
        statistics.median(think) if think else 0.0,
    )


@dataclass(frozen=True)
class Turn:
    """One request of the workload as the simulator needs it (no timing)."""

    input_len: int
    output_len: int
    block_hashes: tuple[int, ...]
    tenant: str


def workload_turns(
    records: Sequence[Any],
    prompts: Mapping[tuple[int, int], list[dict[str, str]]],
    users: Mapping[int, str],
    front: Frontend,
) -> dict[int, list[Turn]]:
    """Each conversation's turns in order: prompt tokens and block hashes as the replicas hash
    them, the completion length (``max_tokens``: the benchmark ignores EOS). Content only."""
    block_size = EngineConfig().block_size
    turns: dict[int, list[Turn]] = {}
    for r in sorted(records, key=lambda r: (r.conv, r.turn)):
        if r.error is not None or r.completion_tokens <= 0:
            continue
        ids = front.render_chat(prompts[(r.conv, r.turn)])
        namespace = b"user:" + users[r.conv].encode("utf-8")
        turns.setdefault(r.conv, []).append(
            Turn(
                len(ids),
                r.completion_tokens,
                prompt_hashes(ids, block_size, namespace),
                users[r.conv],
            )
        )
    return turns


def predict_closed_loop(
    turns: Mapping[int, Sequence[Turn]],
    starts: Mapping[int, float],
    cost_model: FittedCostModel,
    router: str,
    replicas: int,
    args: argparse.Namespace,
    overhead: FrontOverhead,
    iterations: int = 12,
    cache_publish: str = "finish",
) -> dict[str, Any]:
    """Predicted goodput of a closed-loop run: turn ``j + 1`` of a conversation is sent when
    the simulated turn ``j`` ended (plus ``think_s``). Arrivals and simulated latencies
    depend on each other, so the simulation is repeated until the arrivals stop moving
    (1 ms) or ``iterations`` runs. ``cache_publish="finish"``: prompt blocks become hits when
    their request ends, as in deepinfer's engine (`SimConfig.cache_publish`)."""
    block_size = EngineConfig().block_size
    engine = EngineConfig(num_blocks=args.num_blocks, max_num_seqs=args.max_num_seqs)
    config = SimConfig(
        SchedulerConfig(
            router=router,
            batch=BatchConfig(
                engine.max_num_seqs, engine.max_batched_tokens, engine.chunked_prefill
            ),
        ),
        num_instances=replicas,
        kv_capacity_tokens=engine.num_blocks * engine.block_size,
        ttft_slo_s=args.ttft_slo,
        tpot_slo_s=args.tpot_slo,
        cache_publish=cache_publish,
    )
    keys = [(c, j) for c in sorted(turns) for j in range(len(turns[c]))]
    e2e: dict[tuple[int, int], float] = {}
    moved = float("inf")
    rounds = 0
    while rounds < iterations and moved > 1e-3:
        rounds += 1
        sent: dict[tuple[int, int], float] = {}
        for c in sorted(turns):
            t = starts[c]
            for j in range(len(turns[c])):
                sent[(c, j)] = t
                t += e2e.get((c, j), 0.0) + overhead.think_s
        order = sorted(keys, key=lambda k: (sent[k], k))
        trace = Trace(
            tuple(
                TraceRequest(
                    i,
                    sent[k] + overhead.inbound_s,
                    turns[k[0]][k[1]].input_len,
                    turns[k[0]][k[1]].output_len,
                    turns[k[0]][k[1]].block_hashes,
                    turns[k[0]][k[1]].tenant,
                    k[0],
                )
                for i, k in enumerate(order)
            ),
            block_size,
        )
        res = run_simulation(trace, config, args.seed, cost_model=cost_model)
        new = {
            order[r.request_id]: r.finish_s + overhead.last_s - sent[order[r.request_id]]
            for r in res.records
            if not r.rejected
        }
        moved = max((abs(new[k] - e2e.get(k, 0.0)) for k in new), default=0.0)
        e2e = new
        records = [(order[r.request_id], r) for r in res.records if not r.rejected]
    ttft, tpot, per_request, client = [], [], [], []
    for k, r in sorted(records, key=lambda kr: kr[0]):
        t_first = r.first_token_s + overhead.first_s - sent[k]
        t_end = r.finish_s + overhead.last_s - sent[k]
        per_request.append([k[0], k[1], sent[k], t_first, t_end])
        client.append((sent[k], t_first, t_end, r.output_len))
        ttft.append(t_first)
        tpot.append((t_end - t_first) / max(1, r.output_len - 1))
    # The measured side (serve_load.summarize) counts through the same function: same SLO
    # test, same window (the workload's time zero to the last request's end).
    good = run_goodput(client, SLO(args.ttft_slo, args.tpot_slo), total=len(keys))
    prompt = sum(r.input_len for _, r in records)
    ttft_sorted = sorted(ttft)
    return {
        "sim_goodput_rps": good.goodput_rps,
        "sim_slo_attainment": good.attainment,
        "sim_wall_s": good.window_s,
        "sim_ttft_p50": ttft_sorted[len(ttft) // 2] if ttft else None,
        "sim_ttft_p90": ttft_sorted[min(len(ttft) - 1, int(0.9 * len(ttft)))] if ttft else None,
        "sim_tpot_p50": sorted(tpot)[len(tpot) // 2] if tpot else None,
        "sim_prefix_hit_rate": sum(r.cached_tokens for _, r in records) / prompt if prompt else 0.0,
        "sim_rounds": rounds,
        # (conversation, turn, sent, TTFT, e2e) per request, client-side seconds
        "sim_requests": per_request,
    }


def speed_factors(spread: float, points: int) -> list[float]:
    """``points`` step-time factors evenly over ``1 +- spread`` (1.0 alone for one point)."""
    if not (0.0 <= spread < 1.0) or points < 1:
        raise ValueError(f"need 0 <= spread < 1 and points >= 1, got {spread}, {points}")
    if points == 1:
        return [1.0]
    return [1.0 - spread + 2.0 * spread * i / (points - 1) for i in range(points)]


def predict_band(
    turns: Mapping[int, Sequence[Turn]],
    starts: Mapping[int, float],
    cost_model: FittedCostModel,
    router: str,
    replicas: int,
    args: argparse.Namespace,
    overhead: FrontOverhead,
    spread: float = 0.1,
    points: int = 5,
    cache_publish: str = "finish",
) -> dict[str, Any]:
    """`predict_closed_loop` with the cost model's step times x each of
    :func:`speed_factors` (``spread``, ``points``); the prediction is the mean goodput and
    attainment over them, and ``sim_goodput_band`` their range.

    Why a band: a closed loop near the SLO is chaotic. Whether a prefill joins the step
    before or after another's decode decides which turn is late, every later turn of that
    conversation moves, and so does the run's end. Session 12's quiet round robin run
    predicted 0.15-0.51 req/s at step times x0.90-1.10 (0.49 at x1.00). A live run is one draw
    of that: the machine's speed between the calibration and the run moves by ~5-10% with
    nothing else running (probes; sched_fidelity.md). The mean over the speeds the machine
    may run at is the figure to compare, not one point of a curve that jumps. The other
    figures (TTFT/TPOT percentiles, hit rate, ``sim_requests``) are the x1.00 run's."""
    runs = [
        predict_closed_loop(
            turns,
            starts,
            cost_model if f == 1.0 else cost_model.scaled(f),
            router,
            replicas,
            args,
            overhead,
            cache_publish=cache_publish,
        )
        for f in speed_factors(spread, points)
    ]
    center = runs[len(runs) // 2]
    if len(runs) % 2 == 0:  # no x1.00 point on the grid: run it for the detail figures
        center = predict_closed_loop(
            turns,
            starts,
            cost_model,
            router,
            replicas,
            args,
            overhead,
            cache_publish=cache_publish,
        )
    goodputs = [r["sim_goodput_rps"] for r in runs]
    return {
        **center,
        "sim_goodput_at_fit": center["sim_goodput_rps"],
        "sim_goodput_rps": statistics.fmean(goodputs),
        "sim_slo_attainment": statistics.fmean(r["sim_slo_attainment"] for r in runs),
        "sim_goodput_band": [min(goodputs), max(goodputs)],
        "sim_speed_factors": speed_factors(spread, points),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description="simulate saved serve_load.py runs again")
    ap.add_argument("results", help="serve_load.json written with --cost-model")
    ap.add_argument("--cost-model", required=True)
    ap.add_argument("--scale", type=float, nargs="+", default=[1.0])
    cli = ap.parse_args()
    saved = json.loads(Path(cli.results).read_text(encoding="utf-8"))
    args = argparse.Namespace(**saved["args"])
    print("| router | replicas | measured goodput | scale | simulated goodput | sim / measured |")
    print("|---|---|---|---|---|---|")
    for row in saved["results"]:
        if "sim_trace" not in row:
            continue
        trace = trace_from_json(row["sim_trace"])
        for scale in cli.scale:
            cm = load_cost_model(cli.cost_model, scale)
            sim = predict(trace, cm, row["router"], row["replicas"], args)
            measured = row["goodput_rps"]
            ratio = sim["sim_goodput_rps"] / measured if measured else float("nan")
            print(
                f"| {row['router']} | {row['replicas']} | {measured:.3f} | {scale:g} | "
                f"{sim['sim_goodput_rps']:.3f} | {ratio:.2f} |"
            )


if __name__ == "__main__":
    main()
