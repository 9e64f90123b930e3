"""Simulator fidelity: predict the CPU engine's own throughput and TTFT from its profile.

1. Profile the engine's steps (``deepinfer.profile``, as ``deepinfer bench --profile``).
2. Fit the simulator's cost model to the profile (``deepinfer-sched calibrate``).
3. Replay a Poisson workload on the engine in real time and measure throughput and TTFT.
4. Simulate the same workload on one instance with the engine's batch limits and the fitted
   model; report predicted against measured (target: within 15%).

    python benchmarks/sched_fidelity.py --requests 24 --rate 0.5 \\
        --out benchmarks/results/sched_fidelity.md

Wall-clock figures depend on what else the machine runs: the report records the load
average before and after, and a run on a busy machine is not a fidelity figure.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time
from pathlib import Path

import numpy as np
import torch

from deepinfer import LLM, EngineConfig, LLMEngine, SamplingParams
from deepinfer.models import LlamaConfig, LlamaModel
from deepinfer.profile import profile_engine, write_profile
from deepinfer_sched.costmodel import fit_profile
from deepinfer_sched.policies import BatchConfig, SchedulerConfig
from deepinfer_sched.sim import SimConfig, run_simulation
from deepinfer_sched.traces import Trace, TraceRequest


def workload(n: int, rate: float, seed: int) -> list[tuple[float, int, int]]:
    """(arrival_s, prompt_len, output_len): Poisson arrivals, lognormal lengths."""
    rng = np.random.default_rng(seed)
    t = np.cumsum(rng.exponential(1.0 / rate, n))
    t -= t[0]  # the first request arrives at 0
    inp = np.clip(rng.lognormal(np.log(160), 0.6, n), 16, 768).astype(int)
    out = np.clip(rng.lognormal(np.log(24), 0.4, n), 4, 64).astype(int)
    return [(float(t[i]), int(inp[i]), int(out[i])) for i in range(n)]


def tiny_engine() -> LLMEngine:
    """A random-weight Llama (4 layers, hidden 256) on the CPU engine: no download, steps of
    milliseconds, the same scheduler and kernels as a real checkpoint."""
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=2048,
        hidden_size=256,
        intermediate_size=704,
        num_layers=4,
        num_heads=8,
        num_kv_heads=4,
        max_position_embeddings=2048,
        eos_token_ids=(2,),
    )
    model = LlamaModel(cfg).eval()
    return LLMEngine(model, None, EngineConfig(num_blocks=1024, max_num_seqs=16))


def replay(
    engine: LLMEngine, work: list[tuple[float, int, int]], seed: int
) -> dict[int, tuple[float, ...]]:
    """Run ``work`` on the engine in real time; per request (arrival, first token, finish)."""
    vocab = engine.model.config.vocab_size
    rng = random.Random(seed)
    prompts = [[rng.randrange(3, vocab) for _ in range(p)] for _, p, _ in work]
    # Seeded prompts: a namespace of this run's own keeps an earlier run's blocks in the
    # persistent prefix cache from being hits (the simulator knows of no earlier run).
    ns = os.urandom(16)
    ids: dict[str, int] = {}
    first: dict[int, float] = {}
    done: dict[int, float] = {}
    t0 = time.perf_counter()
    nxt = 0
    while len(done) < len(work):
        now = time.perf_counter() - t0
        while nxt < len(work) and work[nxt][0] <= now:
            _, _, out = work[nxt]
            params = SamplingParams(temperature=0.0, max_tokens=out, ignore_eos=True)
            ids[engine.add_request(prompts[nxt], params, namespace=ns)] = nxt
            nxt += 1
        if not engine.has_unfinished():
            time.sleep(max(0.0, work[nxt][0] - now))
            continue
        for o in engine.step():
            i = ids[o.request_id]
            t = time.perf_counter() - t0
            if i not in first and o.token_ids:
                first[i] = t
            if o.finished:
                done[i] = t
    return {i: (work[i][0], first[i], done[i]) for i in range(len(work))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="GGUF/HF model (default: the embedded one)")
    ap.add_argument("--tiny", action="store_true", help="a random 4-layer model instead")
    ap.add_argument("--requests", type=int, default=24)
    ap.add_argument("--rate", type=float, default=0.5, help="requests per second")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=None, help="markdown report")
    args = ap.parse_args()
    load0 = os.getloadavg()[0]
    engine = tiny_engine() if args.tiny else LLM(args.model, dtype="float32").engine
    name = "tiny random Llama (4 x 256)" if args.tiny else str(args.model or "embedded")
    cfg = engine.config
    t = time.perf_counter()
    prof = profile_engine(
        engine,
        prefill_lens=(16, 64, 128, 256, 512, 768),
        batch_sizes=(1, 2, 4, 8),
        context_lens=(64, 256, 768),
        decode_steps=3,
        repeats=2,
        model_name=name,
    )
    profile_s = time.perf_counter() - t
    cm = fit_profile(prof)
    work = workload(args.requests, args.rate, args.seed)
    t = time.perf_counter()
    measured = replay(engine, work, args.seed)
    replay_s = time.perf_counter() - t
    trace = Trace(
        tuple(TraceRequest(i, a, p, o, ()) for i, (a, p, o) in enumerate(work)), cfg.block_size
    )
    sim_cfg = SimConfig(
        SchedulerConfig(
            batch=BatchConfig(cfg.max_num_seqs, cfg.max_batched_tokens, cfg.chunked_prefill)
        ),
        num_instances=1,
        kv_capacity_tokens=prof["kv_capacity_tokens"],
        ttft_slo_s=1e3,
        tpot_slo_s=1e3,
    )
    res = run_simulation(trace, sim_cfg, 0, cost_model=cm)
    out_tokens = sum(o for _, _, o in work)
    m_span = max(f for _, _, f in measured.values()) - work[0][0]
    p_span = max(r.finish_s for r in res.records) - work[0][0]
    m_ttft = [measured[i][1] - measured[i][0] for i in range(len(work))]
    p_ttft = [r.ttft_s for r in res.records]
    rows = {
        "throughput (output tokens/s)": (out_tokens / p_span, out_tokens / m_span),
        "mean TTFT (s)": (float(np.mean(p_ttft)), float(np.mean(m_ttft))),
        "p50 TTFT (s)": (float(np.median(p_ttft)), float(np.median(m_ttft))),
    }
    load1 = os.getloadavg()[0]
    lines = [
        "# deepinfer_sched: simulator fidelity against the CPU engine",
        "",
        f"Model {name}; engine max_num_seqs {cfg.max_num_seqs}, "
        f"max_batched_tokens {cfg.max_batched_tokens}; {args.requests} requests, Poisson "
        f"{args.rate} req/s, prompts lognormal (median 160), outputs median 24. Profile "
        f"{profile_s:.0f} s, replay {replay_s:.0f} s. Load average {load0:.1f} -> {load1:.1f} "
        f"on {os.cpu_count()} CPUs. Fit: {cm.fit_error}.",
        "",
        "| figure | predicted | measured | error |",
        "|---|---|---|---|",
    ]
    for name, (p, m) in rows.items():
        lines.append(f"| {name} | {p:.3f} | {m:.3f} | {(p - m) / m:+.1%} |")
    lines += [
        "",
        f"Reproduce: `python benchmarks/sched_fidelity.py --requests {args.requests} "
        f"--rate {args.rate} --seed {args.seed}{' --tiny' if args.tiny else ''}`",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)
        write_profile(prof, args.out.with_suffix(".profile.json"))
        args.out.with_suffix(".costmodel.json").write_text(cm.to_json())
        (args.out.with_suffix(".json")).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
