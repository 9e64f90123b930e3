"""Multi-turn agent workload through `deepinfer serve`: goodput per router, and server overhead.

Run (each router starts its own server; a fresh prefix-cache directory per run):

    .venv/bin/python benchmarks/serve_load.py --replicas 2 \\
        --routers round_robin least_loaded power_of_two prefix_affinity cost ttft_estimate
    .venv/bin/python benchmarks/serve_load.py --overhead   # HTTP vs offline LLM.generate

The workload is agent-like: a few long system prompts (tool schemas) shared by many
conversations, histories that grow turn by turn, and tool outputs pasted into each user turn.
Conversations arrive as a Poisson process; within one, each turn is sent when the previous
answer has streamed in. Each request streams over HTTP (chat completions, ``include_usage``):
TTFT is the time to the first content chunk, ITL the gaps between chunks, TPOT
``(e2e - ttft) / (completion_tokens - 1)``. Goodput counts requests meeting both SLOs per second
of the run, from the workload's time zero to the last request's end
(`deepinfer_sched.report.run_goodput`, which the simulator's side uses too); the prefix hit rate is ``cached_tokens / prompt_tokens`` from ``usage``.

With ``--cost-model costmodel.json`` (``deepinfer bench --profile`` then ``deepinfer-sched
calibrate``) each run is also replayed through the simulator with that fitted cost model, the
same router and replica count and the run's own arrival times and lengths (`serve_sim.py`), and
the table gains the predicted goodput beside the measured one.

Writes ``<out>/serve_load.json``, ``<out>/serve_load.md`` (a table) and ``<out>/serve_load.png``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from deepinfer_sched.report import SLO, run_goodput

WORDS = [
    "file",
    "path",
    "line",
    "error",
    "value",
    "return",
    "module",
    "class",
    "function",
    "search",
    "result",
    "read",
    "write",
    "test",
    "pass",
    "fail",
    "config",
    "parse",
    "token",
    "cache",
    "block",
    "replica",
    "router",
    "queue",
    "latency",
    "batch",
]


# ---------------------------------------------------------------------- workload
@dataclass
class Conversation:
    start_s: float
    system: str
    user_turns: list[str]
    user: str


def build_workload(args: argparse.Namespace) -> list[Conversation]:
    rng = random.Random(args.seed)
    systems = [
        f"You are agent {k}. Tools: "
        + " ".join(rng.choice(WORDS) for _ in range(args.system_words))
        for k in range(args.system_prompts)
    ]
    t = 0.0
    convs = []
    for i in range(args.conversations):
        t += rng.expovariate(args.rate)
        turns = []
        for j in range(args.turns):
            tool = " ".join(rng.choice(WORDS) for _ in range(args.tool_words))
            turns.append(f"Turn {j}: tool output follows. {tool} What next?")
        convs.append(Conversation(t, systems[i % len(systems)], turns, f"tenant-{i % 2}"))
    return convs


@dataclass
class Record:
    conv: int
    turn: int
    start: float
    ttft: float | None = None
    e2e: float | None = None
    itl: list[float] = field(default_factory=list)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    replica: int = -1
    error: str | None = None


async def run_conversation(
    client: httpx.AsyncClient,
    base: str,
    model: str,
    i: int,
    conv: Conversation,
    t0: float,
    max_tokens: int,
    records: list[Record],
    prompts: dict[tuple[int, int], list[dict[str, str]]],
) -> None:
    await asyncio.sleep(max(0.0, t0 + conv.start_s - time.perf_counter()))
    messages: list[dict[str, str]] = [{"role": "system", "content": conv.system}]
    for j, user in enumerate(conv.user_turns):
        messages.append({"role": "user", "content": user})
        prompts[(i, j)] = list(messages)  # what the simulator's trace hashes
        rec = Record(i, j, time.perf_counter() - t0)
        records.append(rec)
        body = {
            "model": model,
            "messages": messages,
            "max_tokens": max_tokens,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
            "user": conv.user,
            "ignore_eos": True,
        }
        start = time.perf_counter()
        last = start
        parts: list[str] = []
        try:
            async with client.stream("POST", f"{base}/v1/chat/completions", json=body) as r:
                if r.status_code != 200:
                    rec.error = f"HTTP {r.status_code}: {(await r.aread())[:200]!r}"
                    return
                rec.replica = int(r.headers.get("x-deepinfer-replica", -1))
                async for line in r.aiter_lines():
                    if not line.startswith("data: {"):
                        continue
                    chunk = json.loads(line[6:])
                    if "error" in chunk:
                        rec.error = chunk["error"]["message"]
                        return
                    if chunk.get("usage"):
                        u = chunk["usage"]
                        rec.prompt_tokens = u["prompt_tokens"]
                        rec.completion_tokens = u["completion_tokens"]
                        rec.cached_tokens = u["prompt_tokens_details"]["cached_tokens"]
                    for c in chunk.get("choices", ()):
                        text = c["delta"].get("content")
                        if text:
                            now = time.perf_counter()
                            if rec.ttft is None:
                                rec.ttft = now - start
                            else:
                                rec.itl.append(now - last)
                            last = now
                            parts.append(text)
        except httpx.HTTPError as exc:
            rec.error = f"{type(exc).__name__}: {exc}"
            return
        rec.e2e = time.perf_counter() - start
        messages.append({"role": "assistant", "content": "".join(parts)})


# ---------------------------------------------------------------------- server
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def server(
    args: argparse.Namespace,
    router: str,
    replicas: int,
    cache_dir: str,
    profile_out: str | None = None,
) -> Any:
    """``deepinfer serve`` for one run; ``profile_out``: its replicas write their live step
    profiles there (``-replica-<i>`` added) when it shuts down at the end of the block."""
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "deepinfer.cli",
        "serve",
        "--served-model-name",
        "bench",
        "--port",
        str(port),
        "--replicas",
        str(replicas),
        "--router",
        router,
        "--cache-dir",
        cache_dir,
        "--num-blocks",
        str(args.num_blocks),
        "--max-num-seqs",
        str(args.max_num_seqs),
        "--threads",
        str(args.threads),
        "--log-level",
        "warning",
    ]
    if args.model:
        cmd.insert(4, args.model)
    if profile_out:
        cmd += ["--profile-out", profile_out]
    proc = subprocess.Popen(cmd, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"server exited with {proc.returncode}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                    break
            time.sleep(0.2)
        yield base
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(120)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    v = sorted(values)
    return v[min(len(v) - 1, int(q * len(v)))]


def summarize(
    router: str, records: list[Record], wall: float, args: argparse.Namespace
) -> dict[str, Any]:
    ok = [r for r in records if r.error is None and r.e2e is not None and r.ttft is not None]
    good = run_goodput(
        ((r.start, r.ttft, r.e2e, max(1, r.completion_tokens)) for r in ok),  # type: ignore[misc]
        SLO(args.ttft_slo, args.tpot_slo),
        total=len(records),
    )
    prompt = sum(r.prompt_tokens for r in ok)
    return {
        "router": router,
        "requests": len(records),
        "errors": len(records) - len(ok),
        "wall_s": wall,
        "window_s": good.window_s,
        "goodput_rps": good.goodput_rps,
        "slo_attainment": good.attainment,
        "output_tokens_per_s": sum(r.completion_tokens for r in ok) / wall,
        "ttft_p50": pct([r.ttft for r in ok], 0.5),  # type: ignore[misc]
        "ttft_p90": pct([r.ttft for r in ok], 0.9),  # type: ignore[misc]
        "ttft_p99": pct([r.ttft for r in ok], 0.99),  # type: ignore[misc]
        "itl_p50": pct([x for r in ok for x in r.itl], 0.5),
        "itl_p99": pct([x for r in ok for x in r.itl], 0.99),
        "prefix_hit_rate": sum(r.cached_tokens for r in ok) / prompt if prompt else 0.0,
        "first_error": next((r.error for r in records if r.error), None),
        "replica_share": {
            str(k): sum(1 for r in ok if r.replica == k) for k in sorted({r.replica for r in ok})
        },
    }


async def replay(
    base: str,
    convs: list[Conversation],
    max_tokens: int,
    prompts: dict[tuple[int, int], list[dict[str, str]]],
    clock: list[float] | None = None,
    probe: list[float] | None = None,
    probe_after: list[float] | None = None,
) -> tuple[list[Record], float]:
    """Run the workload; ``clock`` (if given) receives the run's start on the
    ``time.perf_counter()`` clock, which the replicas' live profiles share. ``probe`` (if
    given) receives the seconds of each request of a fixed probe sent before the run (see
    :func:`speed_probe`), ``probe_after`` those of one sent after it on other prompts (the
    first probe's would be prefix-cache hits by then)."""
    records: list[Record] = []
    limits = httpx.Limits(max_connections=256, max_keepalive_connections=256)
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:
        # Warm the HTTP path and the replicas before the clock starts (not in the figures).
        await client.post(
            f"{base}/v1/completions", json={"model": "bench", "prompt": "hi", "max_tokens": 2}
        )
        if probe is not None:
            probe.extend(await speed_probe(client, base))
        t0 = time.perf_counter()
        if clock is not None:
            clock.append(t0)
        await asyncio.gather(
            *(
                run_conversation(client, base, "bench", i, c, t0, max_tokens, records, prompts)
                for i, c in enumerate(convs)
            )
        )
        wall = time.perf_counter() - t0
        if probe_after is not None:
            probe_after.extend(await speed_probe(client, base, first=PROBE_REQUESTS))
    return records, wall


PROBE_REQUESTS = 4
PROBE_WORDS = 120
PROBE_TOKENS = 8


async def speed_probe(client: httpx.AsyncClient, base: str, first: int = 0) -> list[float]:
    """Seconds of each of a fixed few completions sent one after another to an idle server:
    the same prompts (seeded, none a prefix of another or of the workload's) and lengths in
    every run, so the ratio between two runs' probes is the machine's speed between them.
    ``first`` numbers the prompts: a probe with another ``first`` sends prompts of the same
    length that share no prefix block with these (one after a run, whose server has cached
    the probe before it)."""
    rng = random.Random(20260 + first)
    out = []
    for k in range(first, first + PROBE_REQUESTS):
        prompt = f"Probe {k}: " + " ".join(rng.choice(WORDS) for _ in range(PROBE_WORDS))
        t = time.perf_counter()
        r = await client.post(
            f"{base}/v1/completions",
            json={
                "model": "bench",
                "prompt": prompt,
                "max_tokens": PROBE_TOKENS,
                "ignore_eos": True,
                "temperature": 0.0,
            },
        )
        r.raise_for_status()
        out.append(time.perf_counter() - t)
    return out


# ---------------------------------------------------------------------- overhead
def overhead(args: argparse.Namespace) -> dict[str, Any]:
    """Output tokens/s of the same prompts: offline ``LLM.generate`` vs one-replica HTTP."""
    import torch

    from deepinfer.engine import EngineConfig, SamplingParams
    from deepinfer.llm import LLM

    rng = random.Random(args.seed)
    prompts = [
        " ".join(rng.choice(WORDS) for _ in range(args.overhead_words))
        for _ in range(args.overhead_prompts)
    ]
    params = SamplingParams(temperature=0.0, max_tokens=args.overhead_tokens, ignore_eos=True)
    torch.set_num_threads(args.threads)
    config = EngineConfig(num_blocks=args.num_blocks, max_num_seqs=args.max_num_seqs)
    rows = []
    for _rep in range(args.overhead_reps):
        with LLM(args.model, engine_config=config, enable_prefix_caching=False) as llm:
            llm.generate(prompts[:1], SamplingParams(max_tokens=2))
            t = time.perf_counter()
            outs = llm.generate(prompts, params)
            offline = sum(len(o.token_ids) for o in outs) / (time.perf_counter() - t)
        with tempfile.TemporaryDirectory() as cache, server(args, "round_robin", 1, cache) as base:

            async def go() -> float:
                async with httpx.AsyncClient(timeout=600) as c:
                    await c.post(
                        f"{base}/v1/completions",
                        json={"model": "bench", "prompt": "hi", "max_tokens": 2},
                    )
                    t = time.perf_counter()
                    rs = await asyncio.gather(
                        *(
                            c.post(
                                f"{base}/v1/completions",
                                json={
                                    "model": "bench",
                                    "prompt": p,
                                    "max_tokens": args.overhead_tokens,
                                    "temperature": 0,
                                    "ignore_eos": True,
                                },
                            )
                            for p in prompts
                        )
                    )
                    n = sum(r.json()["usage"]["completion_tokens"] for r in rs)
                    return n / (time.perf_counter() - t)

            online = asyncio.run(go())
        rows.append({"offline_tok_s": offline, "http_tok_s": online, "ratio": online / offline})
        print(json.dumps(rows[-1]))
    return {"runs": rows}


# ---------------------------------------------------------------------- report
def write_report(out: Path, results: list[dict[str, Any]], args: argparse.Namespace) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "serve_load.json").write_text(
        json.dumps({"args": vars(args), "results": results}, indent=2), encoding="utf-8"
    )

    def f(v: Any, n: int = 3) -> str:
        return "-" if v is None else f"{v:.{n}f}"

    sim = any("sim_goodput_rps" in r for r in results)
    lines = [
        "| router | replicas | goodput req/s | SLO met | out tok/s | TTFT p50 / p90 / p99 s | ITL p50 / p99 s | prefix hit | errors |"
        + (
            " simulated goodput req/s | sim / measured | sim TTFT p50 / p90 s | sim prefix hit |"
            if sim
            else ""
        ),
        "|---|---|---|---|---|---|---|---|---|" + ("---|---|---|---|" if sim else ""),
    ]
    for r in results:
        line = (
            f"| {r['router']} | {r['replicas']} | {f(r['goodput_rps'])} | {r['slo_attainment']:.0%} | "
            f"{f(r['output_tokens_per_s'], 1)} | {f(r['ttft_p50'])} / {f(r['ttft_p90'])} / {f(r['ttft_p99'])} | "
            f"{f(r['itl_p50'])} / {f(r['itl_p99'])} | {r['prefix_hit_rate']:.0%} | {r['errors']} |"
        )
        if "sim_goodput_rps" in r:
            ratio = r["sim_goodput_rps"] / r["goodput_rps"] if r["goodput_rps"] else None
            line += (
                f" {f(r['sim_goodput_rps'])} | {f(ratio, 2)} | {f(r['sim_ttft_p50'])} / "
                f"{f(r['sim_ttft_p90'])} | {r['sim_prefix_hit_rate']:.0%} |"
            )
        lines.append(line)
    (out / "serve_load.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    labels = [f"{r['router']}\nx{r['replicas']}" for r in results]
    axes[0].bar(labels, [r["goodput_rps"] for r in results], color="tab:green")
    axes[0].set_title(f"goodput (TTFT<={args.ttft_slo}s, TPOT<={args.tpot_slo}s), req/s")
    axes[1].bar(labels, [r["ttft_p50"] or 0 for r in results], label="p50")
    axes[1].bar(
        labels,
        [(r["ttft_p99"] or 0) - (r["ttft_p50"] or 0) for r in results],
        bottom=[r["ttft_p50"] or 0 for r in results],
        alpha=0.5,
        label="p99",
    )
    axes[1].set_title("TTFT, s")
    axes[1].legend()
    axes[2].bar(labels, [r["prefix_hit_rate"] for r in results], color="tab:purple")
    axes[2].set_title("prefix hit rate")
    for ax in axes:
        ax.tick_params(axis="x", labelsize=7, rotation=30)
    fig.tight_layout()
    fig.savefig(out / "serve_load.png", dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="GGUF/model dir (default: embedded SmolLM2)")
    ap.add_argument("--replicas", type=int, nargs="+", default=[2])
    ap.add_argument("--routers", nargs="+", default=["round_robin", "prefix_affinity", "cost"])
    ap.add_argument("--conversations", type=int, default=12)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--rate", type=float, default=1.0, help="conversations per second")
    ap.add_argument("--system-prompts", type=int, default=2)
    ap.add_argument("--system-words", type=int, default=300)
    ap.add_argument("--tool-words", type=int, default=40)
    ap.add_argument("--max-tokens", type=int, default=12)
    ap.add_argument("--ttft-slo", type=float, default=2.0)
    ap.add_argument("--tpot-slo", type=float, default=0.25)
    ap.add_argument("--num-blocks", type=int, default=1024)
    ap.add_argument("--max-num-seqs", type=int, default=16)
    ap.add_argument("--threads", type=int, default=1, help="torch threads per replica")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--cost-model",
        default=None,
        help="fitted cost model JSON (deepinfer-sched calibrate): also predict each run",
    )
    ap.add_argument("--repeats", type=int, default=1, help="runs per router and replica count")
    ap.add_argument("--out", default="out/serve_load")
    ap.add_argument("--overhead", action="store_true", help="HTTP vs offline tokens/s only")
    ap.add_argument("--overhead-prompts", type=int, default=8)
    ap.add_argument("--overhead-words", type=int, default=60)
    ap.add_argument("--overhead-tokens", type=int, default=32)
    ap.add_argument("--overhead-reps", type=int, default=2)
    args = ap.parse_args()
    out = Path(args.out)
    if args.overhead:
        out.mkdir(parents=True, exist_ok=True)
        res = overhead(args)
        (out / "serve_overhead.json").write_text(json.dumps(res, indent=2), encoding="utf-8")
        return
    convs = build_workload(args)
    results = []
    predictor = None
    if args.cost_model:
        import serve_sim  # the simulator side: deepinfer_sched and the model's tokenizer

        predictor = (serve_sim, serve_sim.load_cost_model(args.cost_model))
        front = serve_sim.frontend(args.model)
    users = {i: c.user for i, c in enumerate(convs)}
    for replicas in args.replicas:
        for router in args.routers * args.repeats:
            prompts: dict[tuple[int, int], list[dict[str, str]]] = {}
            with (
                tempfile.TemporaryDirectory() as cache,
                server(args, router, replicas, cache) as base,
            ):
                records, wall = asyncio.run(replay(base, convs, args.max_tokens, prompts))
            row = {**summarize(router, records, wall, args), "replicas": replicas}
            row["load_average"] = os.getloadavg()[0]
            if predictor is not None:
                sim, cost_model = predictor
                trace = sim.build_trace(records, prompts, users, front)
                row.update(sim.predict(trace, cost_model, router, replicas, args))
                row["sim_trace"] = sim.trace_to_json(trace)
            print(
                json.dumps({k: v for k, v in row.items() if k not in ("sim_records", "sim_trace")})
            )
            row["records"] = [asdict(r) for r in records]  # goodput at other SLOs, later
            results.append(row)
    write_report(out, results, args)


if __name__ == "__main__":
    main()
