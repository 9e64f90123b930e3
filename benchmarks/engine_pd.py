"""TTFT and TPOT of PD mode (prefill and decode worker processes) vs the colocated engine.

The embedded SmolLM2-135M-Instruct, greedy, one request at a time (latency, not throughput),
torch pinned to ``--threads`` threads in the colocated engine and in each PD worker. TTFT is
measured from submission to the first token the caller sees (``RequestOutput.metrics``; in PD
mode the coordinator's clock, so it includes the prefill worker's compute, exporting the KV pages
to shared memory and the JSON round trip); TPOT is ``(finish - first token) / (tokens - 1)``
(in PD mode it includes scattering the pages into the decode pool and one pipe message per
token). Modes alternate per repeat so machine load drift hits both alike. Outputs of the two
modes are also checked to be token-identical. Both run without a prefix cache here (a repeated
prompt would hit it).

A third table runs two prefill workers and compares routers on second turns. A second table
measures the prefill workers' prefix cache: a conversation's first turn (a long
prompt) and its second turn (the first prompt, the answer and a follow-up) in PD mode with the
cache on (memory tiers and the worker's disk directory under a temporary directory), each
repeat under its own namespace so every first turn starts cold.

    .venv/bin/python benchmarks/engine_pd.py --out benchmarks/results/engine_pd.md
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from deepinfer import LLM, EngineConfig, RequestOutput, SamplingParams
from deepinfer.engine.cache_setup import PrefixCacheConfig
from deepinfer.pd import PDConfig

PROMPTS = [
    "Write a Python function that reverses a linked list.",
    "Explain in two sentences why the sky is blue. " * 6,
    "Summarise the plot of Hamlet for a ten-year-old, then list three themes of the play. " * 12,
]


def _stats(outs: list[RequestOutput]) -> tuple[float, float]:
    ttft, tpot = [], []
    for o in outs:
        m = o.metrics
        assert m is not None and m.first_token_time is not None and m.finish_time is not None
        ttft.append(m.first_token_time - m.arrival_time)
        if len(o.token_ids) > 1:
            tpot.append((m.finish_time - m.first_token_time) / (len(o.token_ids) - 1))
    return statistics.median(ttft), statistics.median(tpot) if tpot else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    engine = EngineConfig(num_blocks=256, max_model_len=2048)
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
    colo = LLM(engine_config=engine, enable_prefix_caching=False)
    t0 = time.perf_counter()
    pd = LLM(
        engine_config=engine, pd=PDConfig(worker_threads=args.threads), enable_prefix_caching=False
    )
    start_s = time.perf_counter() - t0
    lens = [len(colo.encode(p)) for p in PROMPTS]
    rows = []
    try:
        colo.generate(PROMPTS[0], params)  # warm-up (the PD workers warm up at start)
        for prompt, n in zip(PROMPTS, lens):
            runs: dict[str, list[RequestOutput]] = {"colocated": [], "pd": []}
            for _ in range(args.repeats):
                runs["colocated"].append(colo.generate(prompt, params)[0])
                runs["pd"].append(pd.generate(prompt, params)[0])
            same = all(a.token_ids == b.token_ids for a, b in zip(runs["colocated"], runs["pd"]))
            (c_ttft, c_tpot), (p_ttft, p_tpot) = _stats(runs["colocated"]), _stats(runs["pd"])
            rows.append((n, c_ttft, p_ttft, c_tpot, p_tpot, same))
            print(
                f"prompt {n:4d} tok: TTFT {c_ttft * 1e3:7.1f} / {p_ttft * 1e3:7.1f} ms, "
                f"TPOT {c_tpot * 1e3:6.1f} / {p_tpot * 1e3:6.1f} ms, identical={same}"
            )
    finally:
        pd.close()
        colo.close()
    turns = _multi_turn(engine, params, args)
    routing = _routing(engine, params, args)
    cmd = ".venv/bin/python benchmarks/engine_pd.py " + " ".join(
        shlex.quote(a) for a in sys.argv[1:]
    )
    lines = [
        "# PD disaggregation vs colocated: TTFT and TPOT (CPU)",
        "",
        f"Command: `{cmd.strip()}`",
        "",
        f"Embedded SmolLM2-135M-Instruct (fp32), greedy, {args.max_tokens} new tokens, one request "
        f"at a time, median of {args.repeats} repeats, torch threads = {args.threads} per process. "
        f"PD: 1 prefill + 1 decode worker process (start-up incl. model load and warm-up: "
        f"{start_s:.1f} s).",
        "",
        "| prompt tokens | TTFT colocated (ms) | TTFT PD (ms) | TPOT colocated (ms) "
        "| TPOT PD (ms) | greedy identical |",
        "|---:|---:|---:|---:|---:|:---:|",
    ]
    for n, c_ttft, p_ttft, c_tpot, p_tpot, same in rows:
        lines.append(
            f"| {n} | {c_ttft * 1e3:.1f} | {p_ttft * 1e3:.1f} | {c_tpot * 1e3:.1f} "
            f"| {p_tpot * 1e3:.1f} | {'yes' if same else 'NO'} |"
        )
    lines += [
        "",
        "Prefill workers' prefix cache, PD mode (same settings, cache on, median of "
        f"{args.repeats} conversations):",
        "",
        "| turn | prompt tokens | cached tokens | TTFT PD (ms) |",
        "|---|---:|---:|---:|",
    ]
    for name, n, cached, ttft in turns:
        lines.append(f"| {name} | {n} | {cached} | {ttft * 1e3:.1f} |")
    lines += [
        "",
        "Routing with two prefill workers: four conversations' first turns at once, then their "
        "second turns at once in reverse order:",
        "",
        "| router | second-turn prompt tokens served from cache | median second-turn TTFT (ms) |",
        "|---|---:|---:|",
    ]
    for router, hit, ttft in routing:
        lines.append(f"| `{router}` | {hit:.0%} | {ttft * 1e3:.1f} |")
    if args.out is not None:
        args.out.write_text("\n".join(lines) + "\n", encoding="utf-8")
        print(f"wrote {args.out}")


def _multi_turn(
    engine: EngineConfig, params: SamplingParams, args: argparse.Namespace
) -> list[tuple[str, int, int, float]]:
    """TTFT of a first turn (cold) and of its second turn (the first prompt's blocks cached in
    the prefill worker) in PD mode."""
    with tempfile.TemporaryDirectory() as tmp:
        cache = PrefixCacheConfig(device_blocks=32, directory=f"{tmp}/kv")
        with LLM(
            engine_config=engine,
            pd=PDConfig(worker_threads=args.threads),
            prefix_cache_config=cache,
        ) as pd:
            first_ids = pd.encode(PROMPTS[2])
            follow_up = pd.encode(" Now do the same for Macbeth, in one paragraph.")
            runs: dict[str, list[RequestOutput]] = {"first": [], "second": []}
            for r in range(args.repeats):
                ns = f"conversation-{r}".encode()
                one = pd.generate([first_ids], params, namespace=ns)[0]
                two_ids = first_ids + one.token_ids + follow_up
                two = pd.generate([two_ids], params, namespace=ns)[0]
                runs["first"].append(one)
                runs["second"].append(two)
    rows = []
    for name, outs in runs.items():
        m = [o.metrics for o in outs]
        assert all(x is not None and x.first_token_time is not None for x in m)
        ttft = statistics.median(x.first_token_time - x.arrival_time for x in m)  # type: ignore[union-attr,operator]
        cached = statistics.median(x.num_cached_tokens for x in m)  # type: ignore[union-attr]
        rows.append((name, len(outs[0].prompt_token_ids), int(cached), ttft))
        print(
            f"PD {name} turn: {rows[-1][1]} tokens, {int(cached)} cached, TTFT {ttft * 1e3:.1f} ms"
        )
    return rows


def _routing(
    engine: EngineConfig, params: SamplingParams, args: argparse.Namespace
) -> list[tuple[str, float, float]]:
    """Two prefill workers, four conversations: all first turns at once, then all second turns
    at once in reverse order. Returns, per router, the share of second-turn prompt tokens
    served from a prefill worker's cache and the median second-turn TTFT."""
    rows = []
    for router in ("prefix_affinity", "least_loaded"):
        with (
            tempfile.TemporaryDirectory() as tmp,
            LLM(
                engine_config=engine,
                pd=PDConfig(num_prefill_workers=2, worker_threads=args.threads, router=router),
                prefix_cache_config=PrefixCacheConfig(device_blocks=64, directory=f"{tmp}/kv"),
            ) as pd,
        ):
            spaces = [f"conversation-{c}".encode() for c in range(4)]
            firsts = [pd.encode(PROMPTS[1 + c % 2]) for c in range(4)]
            ones = pd.generate(firsts, params, namespace=spaces)
            follow_up = pd.encode(" Now answer again, more briefly.")
            seconds = [f + o.token_ids + follow_up for f, o in zip(firsts, ones)]
            twos = pd.generate(seconds[::-1], params, namespace=spaces[::-1])
        hit = sum(o.metrics.num_cached_tokens for o in twos if o.metrics) / sum(map(len, seconds))
        ttft = statistics.median(
            o.metrics.first_token_time - o.metrics.arrival_time  # type: ignore[operator]
            for o in twos
            if o.metrics
        )
        rows.append((router, hit, ttft))
        print(f"PD routing {router}: second turns {hit:.0%} cached, TTFT {ttft * 1e3:.1f} ms")
    return rows


if __name__ == "__main__":
    main()
