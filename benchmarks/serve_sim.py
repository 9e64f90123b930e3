"""The simulator's prediction of a `serve_load.py` run: the same requests through
`deepinfer_sched` with a cost model fitted to the engine's own step profile.

    OMP_NUM_THREADS=1 deepinfer bench --num-prompts 4 --profile profile.json
    deepinfer-sched calibrate --profile profile.json --out costmodel.json
    python benchmarks/serve_load.py --cost-model costmodel.json ...
    python benchmarks/serve_sim.py out/serve_load/serve_load.json --cost-model costmodel.json

The second form simulates the runs saved in ``serve_load.json`` again (their traces are kept
there), e.g. with ``--scale`` to see how much of a gap is the machine's contention.

The trace is the measured run's: each request arrives when the benchmark sent it (later turns
of a conversation were sent when the previous answer had streamed in, so the simulator replays
the live run's arrival times open-loop), with the prompt and completion lengths the server
reported and the prompt's chained block hashes computed exactly as the replicas' prefix caches
do (the tenant namespace folded in), so the simulated prefix caches hit where the live ones
could. The cluster is the server's: ``replicas`` instances with the engine's batch limits and
KV pool, routed by the same router under the same SLO.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from deepinfer.engine.config import EngineConfig
from deepinfer.serve.frontend import Frontend, load_frontend
from deepinfer.serve.routing import prompt_hashes
from deepinfer_sched.costmodel import FittedCostModel
from deepinfer_sched.policies import BatchConfig, SchedulerConfig
from deepinfer_sched.sim import SimConfig, run_simulation
from deepinfer_sched.traces import Trace, TraceRequest


def load_cost_model(path: str | Path, scale: float = 1.0) -> FittedCostModel:
    """A fitted cost model; ``scale`` multiplies every step time (a diagnostic: the share of
    a core each replica really got while the profile ran alone)."""
    cm = FittedCostModel.from_json(Path(path).read_text(encoding="utf-8"))
    if scale == 1.0:
        return cm
    return replace(
        cm,
        prefill_coef=tuple(scale * c for c in cm.prefill_coef),  # type: ignore[arg-type]
        decode_coef=tuple(scale * c for c in cm.decode_coef),  # type: ignore[arg-type]
    )


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

    def tpot(r: Any) -> float:
        return (r.finish_s - r.first_token_s) / max(1, r.output_len - 1)

    ttfts = sorted(r.first_token_s - r.arrival_s for r in recs)
    good = [
        r
        for r in recs
        if r.first_token_s - r.arrival_s <= args.ttft_slo and tpot(r) <= args.tpot_slo
    ]
    span = max(r.finish_s for r in recs) if recs else 0.0
    prompt = sum(r.input_len for r in recs)
    return {
        "sim_goodput_rps": len(good) / span if span > 0 else 0.0,
        "sim_slo_attainment": len(good) / max(1, len(trace.requests)),
        "sim_wall_s": span,
        "sim_ttft_p50": ttfts[len(ttfts) // 2] if ttfts else None,
        "sim_ttft_p90": ttfts[min(len(ttfts) - 1, int(0.9 * len(ttfts)))] if ttfts else None,
        "sim_prefix_hit_rate": sum(r.cached_tokens for r in recs) / prompt if prompt else 0.0,
        # (arrival, first token, finish, output tokens) per request: goodput at other SLOs
        "sim_records": [[r.arrival_s, r.first_token_s, r.finish_s, r.output_len] for r in recs],
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
