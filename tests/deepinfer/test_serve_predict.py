"""`benchmarks/serve_sim.py`'s held-out prediction (closed-loop turns, the front's overhead) and
`serve_load.speed_probe`."""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import httpx
import pytest

from deepinfer_sched.costmodel import FittedCostModel

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def serve_sim() -> ModuleType:
    spec = importlib.util.spec_from_file_location("serve_sim", ROOT / "benchmarks/serve_sim.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["serve_sim"] = module
    spec.loader.exec_module(module)
    return module


@dataclass
class Rec:  # the fields of serve_load.Record the overhead reads
    conv: int
    turn: int
    start: float
    ttft: float | None
    e2e: float | None
    prompt_tokens: int
    completion_tokens: int = 4
    error: str | None = None


def _args(**kw: float) -> argparse.Namespace:
    base = {"num_blocks": 256, "max_num_seqs": 8, "ttft_slo": 1.0, "tpot_slo": 0.05, "seed": 0}
    return argparse.Namespace(**{**base, **kw})


def test_closed_loop_sends_each_turn_when_the_simulated_previous_one_ended(
    serve_sim: ModuleType,
) -> None:
    cm = FittedCostModel((0.01, 1e-4, 0.0), (0.01, 1e-3, 0.0), 1024, 4096)
    turns = {c: [serve_sim.Turn(40 + 30 * j, 5, (), "t") for j in range(3)] for c in range(2)}
    overhead = serve_sim.FrontOverhead(inbound_s=0.02, first_s=0.01, last_s=0.005, think_s=0.1)
    pred = serve_sim.predict_closed_loop(
        turns, {0: 0.0, 1: 0.05}, cm, "round_robin", 1, _args(), overhead
    )
    rows = {(c, j): (sent, ttft, e2e) for c, j, sent, ttft, e2e in pred["sim_requests"]}
    assert len(rows) == 6 and pred["sim_rounds"] >= 2
    for c in range(2):
        for j in range(1, 3):
            sent, _, _ = rows[(c, j)]
            prev_sent, _, prev_e2e = rows[(c, j - 1)]
            assert sent == pytest.approx(prev_sent + prev_e2e + overhead.think_s, abs=2e-3)
    # Conversation 0's first turn runs alone: the front's overhead plus one prefill step.
    _, ttft, e2e = rows[(0, 0)]
    assert ttft == pytest.approx(0.02 + cm.prefill_time(40) + 0.01, rel=1e-6)
    assert e2e > ttft
    assert pred["sim_goodput_rps"] == pytest.approx(
        pred["sim_slo_attainment"] * 6 / pred["sim_wall_s"]
    )


def test_front_overhead_matches_client_records_to_replica_rows(serve_sim: ModuleType) -> None:
    t0 = 100.0
    records = [
        Rec(0, 0, 1.0, ttft=0.5, e2e=0.9, prompt_tokens=50),
        Rec(0, 1, 1.95, ttft=0.4, e2e=0.8, prompt_tokens=70),
        Rec(1, 0, 1.2, ttft=None, e2e=None, prompt_tokens=50, error="HTTP 500"),
    ]
    # [received, first token, finished, prompt, cached]: 30 ms in, 20 ms / 10 ms out.
    rows = [
        [101.03, 101.48, 101.89, 50, 0],
        [101.98, 102.33, 102.74, 70, 48],
        [99.0, 99.1, 99.2, 2, 0],  # the warm-up request, before the run
    ]
    oh = serve_sim.front_overhead(records, t0, [{"requests": rows}])
    assert oh.inbound_s == pytest.approx(0.03)
    assert oh.first_s == pytest.approx(0.02)
    assert oh.last_s == pytest.approx(0.01)
    assert oh.think_s == pytest.approx(0.05)
    with pytest.raises(ValueError, match="no client request matched"):
        serve_sim.front_overhead(records, t0 + 50, [{"requests": rows}])


@pytest.fixture(scope="module")
def serve_load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("serve_load", ROOT / "benchmarks/serve_load.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["serve_load"] = module
    spec.loader.exec_module(module)
    return module


def test_speed_probe_sends_the_same_fixed_requests_every_run(serve_load: ModuleType) -> None:
    # The probe's ratio between two runs is a speed ratio only if both runs send the same
    # work: same prompts and lengths, none a prefix of another (no cache hit inside a probe).
    seen: list[dict[str, object]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(json.loads(request.content))
        return httpx.Response(200, json={"choices": [{"text": "x"}]})

    async def probe() -> list[float]:
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            return list(await serve_load.speed_probe(client, "http://probe"))

    first = asyncio.run(probe())
    second = asyncio.run(probe())
    n = serve_load.PROBE_REQUESTS
    assert len(first) == len(second) == n and all(t > 0 for t in first + second)
    assert seen[:n] == seen[n:]
    prompts = [str(r["prompt"]) for r in seen[:n]]
    assert len(set(prompts)) == n
    assert not any(a != b and b.startswith(a[:40]) for a in prompts for b in prompts)
    assert all(r["max_tokens"] == serve_load.PROBE_TOKENS and r["ignore_eos"] for r in seen)

    def failing(request: httpx.Request) -> httpx.Response:
        return httpx.Response(500, json={"error": "down"})

    async def broken() -> None:
        async with httpx.AsyncClient(transport=httpx.MockTransport(failing)) as client:
            await serve_load.speed_probe(client, "http://probe")

    with pytest.raises(httpx.HTTPStatusError):
        asyncio.run(broken())
