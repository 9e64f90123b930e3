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
from typing import Any

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


def test_the_probe_after_a_run_sends_other_prompts_of_the_same_size(
    serve_load: ModuleType,
) -> None:
    # After a run the server has cached the first probe's prompts: repeating them would time
    # prefix-cache hits. The second probe's prompts share no prefix with the first's.
    seen: list[dict[str, object]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(json.loads(request.content))
        return httpx.Response(200, json={"choices": [{"text": "x"}]})

    async def probes() -> None:
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            await serve_load.speed_probe(client, "http://probe")
            await serve_load.speed_probe(client, "http://probe", first=serve_load.PROBE_REQUESTS)

    asyncio.run(probes())
    n = serve_load.PROBE_REQUESTS
    before = [str(r["prompt"]) for r in seen[:n]]
    after = [str(r["prompt"]) for r in seen[n:]]
    assert len(after) == n and not set(before) & set(after)
    assert not any(b[:12] == a[:12] for a in after for b in before)
    assert sorted(len(p.split()) for p in before) == sorted(len(p.split()) for p in after)


def _saved_run() -> dict[str, object]:
    path = ROOT / "benchmarks/results/serve_predict.quiet3.json"
    doc: dict[str, object] = json.loads(path.read_text(encoding="utf-8"))
    return doc


def _closed_loop_inputs(serve_sim: ModuleType, saved: dict[str, Any]) -> tuple[Any, Any]:
    turns = {
        int(c): [serve_sim.Turn(n, o, tuple(h), t) for n, o, h, t in ts]
        for c, ts in saved["turns"].items()
    }
    return turns, {int(c): float(t) for c, t in saved["starts"].items()}


def test_a_saved_run_replays_to_the_same_simulated_makespan(serve_sim: ModuleType) -> None:
    """The saved quiet round robin run (session 12) predicted again from its saved workload
    and cost model: the same simulated makespan, attainment and goodput as recorded then
    (the goodput accounting moved to `run_goodput` without changing what it counts)."""
    doc: dict[str, Any] = _saved_run()
    saved, row = doc["held_out"][0], doc["rows"][0]
    assert saved["router"] == row["router"] == "round_robin"
    args = argparse.Namespace(**{**doc["args"], "seed": saved["seed"]})
    turns, starts = _closed_loop_inputs(serve_sim, saved)
    pred = serve_sim.predict_closed_loop(
        turns,
        starts,
        FittedCostModel.from_json(doc["cost_model"]),
        "round_robin",
        args.replicas,
        args,
        serve_sim.FrontOverhead(**doc["front_overhead"]),
    )
    assert pred["sim_wall_s"] == pytest.approx(row["sim_wall_s"], rel=1e-9)
    assert pred["sim_slo_attainment"] == pytest.approx(row["sim_slo_attainment"])
    assert pred["sim_goodput_rps"] == pytest.approx(row["sim_goodput_rps"], rel=1e-9)


def test_measured_accounting_of_the_simulated_requests_gives_the_simulated_goodput(
    serve_sim: ModuleType, serve_load: ModuleType
) -> None:
    """Both sides measure the same thing: the simulated requests, written as the client's
    records and summarised by the measured side's code, give the simulated goodput, window
    and attainment."""
    cm = FittedCostModel((0.03, 2e-4, 0.0), (0.01, 2e-3, 1e-6), 1024, 8192)
    turns = {c: [serve_sim.Turn(60 + 40 * j, 6, (), "t") for j in range(3)] for c in range(4)}
    starts = {0: 0.4, 1: 0.42, 2: 0.45, 3: 1.6}
    overhead = serve_sim.FrontOverhead(inbound_s=0.01, first_s=0.005, last_s=0.004, think_s=0.02)
    args = _args(ttft_slo=0.07, tpot_slo=0.04)
    pred = serve_sim.predict_closed_loop(turns, starts, cm, "round_robin", 2, args, overhead)
    assert 0.0 < pred["sim_slo_attainment"] < 1.0  # the SLO cuts through this run
    records = [
        serve_load.Record(c, j, sent, ttft=ttft, e2e=e2e, completion_tokens=6)
        for c, j, sent, ttft, e2e in pred["sim_requests"]
    ]
    last_end = max(r.start + r.e2e for r in records)
    # The harness stops its clock a little after the last chunk: not part of the window.
    measured = serve_load.summarize("round_robin", records, last_end + 0.5, args)
    assert measured["window_s"] == pytest.approx(pred["sim_wall_s"], rel=1e-12)
    assert measured["goodput_rps"] == pytest.approx(pred["sim_goodput_rps"], rel=1e-12)
    assert measured["slo_attainment"] == pytest.approx(pred["sim_slo_attainment"], rel=1e-12)


def test_the_prediction_band_is_the_mean_over_the_machine_s_speeds(serve_sim: ModuleType) -> None:
    doc: dict[str, Any] = _saved_run()
    saved = doc["held_out"][0]
    args = argparse.Namespace(**{**doc["args"], "seed": saved["seed"]})
    turns, starts = _closed_loop_inputs(serve_sim, saved)
    cm = FittedCostModel.from_json(doc["cost_model"])
    oh = serve_sim.FrontOverhead(**doc["front_overhead"])
    factors = serve_sim.speed_factors(0.1, 3)
    assert factors == pytest.approx([0.9, 1.0, 1.1])
    band = serve_sim.predict_band(turns, starts, cm, "round_robin", 2, args, oh, 0.1, 3)
    each = [
        serve_sim.predict_closed_loop(
            turns, starts, cm if f == 1.0 else cm.scaled(f), "round_robin", 2, args, oh
        )["sim_goodput_rps"]
        for f in factors
    ]
    assert band["sim_goodput_rps"] == pytest.approx(sum(each) / 3)
    assert band["sim_goodput_band"] == pytest.approx([min(each), max(each)])
    assert band["sim_goodput_at_fit"] == pytest.approx(each[1])
    # This run is one of the chaotic ones: +-10% step time moves its goodput by far more
    # than 10% (what the band is for).
    assert max(each) / min(each) > 1.3
    one = serve_sim.predict_band(turns, starts, cm, "round_robin", 2, args, oh, 0.1, 1)
    assert one["sim_goodput_rps"] == pytest.approx(each[1])
    for spread, points in ((-0.1, 3), (1.0, 3), (0.1, 0)):
        with pytest.raises(ValueError, match="spread"):
            serve_sim.speed_factors(spread, points)


@pytest.fixture(scope="module")
def serve_predict(serve_sim: ModuleType, serve_load: ModuleType) -> ModuleType:
    path = ROOT / "benchmarks/serve_predict.py"
    spec = importlib.util.spec_from_file_location("serve_predict", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # imports serve_load / serve_sim: the fixtures' modules
    return module


def test_the_per_kind_step_table_charges_what_the_simulator_charges(
    serve_predict: ModuleType,
) -> None:
    """A fit exact on its steps charges every kind x1.00; a model whose lone decode step is
    1.5x too slow shows x1.50 there and nowhere else."""
    o, e, p1, d1, d2, k = 0.01, 0.02, 1e-4, 1e-3, 1e-6, 5e-5
    steps = []
    for i in range(60):
        pre = [[50 + i, 0]] if i % 3 == 0 else [[20, 100 + i]] if i % 3 == 1 else []
        b = 1 if i % 5 == 0 else (0 if pre and i % 2 else 1 + i % 4)
        if not pre and b == 0:
            b = 2
        t = b * (200 + 7 * i)
        secs = o + sum(e + p1 * n + k * c for n, c in pre) + d1 * b + d2 * t
        steps.append({"prefill": pre, "batch_size": b, "context_tokens": t, "seconds": secs})
    cm = FittedCostModel((o + e, p1, 0.0), (o, d1, d2), 1024, 8192, cached_coef=k)
    for st in steps:
        assert serve_predict.step_charge(cm, st) == pytest.approx(st["seconds"], rel=1e-12)
    table = serve_predict.kind_table(cm, [("exact", steps)])
    row = table[2].split(" | ")
    assert row[0] == "| exact" and row[1].startswith("x1.00")
    assert all(c.startswith("x1.00") for c in row[2:] if c.strip(" |") != "-")
    slow = [
        {**st, "seconds": st["seconds"] / 1.5}
        if serve_predict.step_kind(st) == "lone decode"
        else st
        for st in steps
    ]
    cells = dict(
        zip(
            serve_predict.STEP_KINDS,
            serve_predict.kind_table(cm, [("s", slow)])[2].split(" | ")[2:],
        )
    )
    assert cells.pop("lone decode").startswith("x1.50")
    assert all(c.startswith("x1.00") for c in cells.values() if c.strip(" |") != "-")


def test_the_open_loop_replay_counts_goodput_as_the_measured_side_does(
    serve_sim: ModuleType, serve_load: ModuleType
) -> None:
    """`serve_sim.predict` (a run's own arrivals replayed open-loop) counts through the same
    `run_goodput` as the measured summary."""
    from deepinfer_sched.traces import Trace, TraceRequest

    cm = FittedCostModel((0.03, 2e-4, 0.0), (0.01, 2e-3, 1e-6), 1024, 8192)
    trace = Trace(
        tuple(TraceRequest(i, 0.3 + 0.02 * i, 80 + 10 * i, 6, (), "t", i) for i in range(8)),
        16,
    )
    args = _args(ttft_slo=0.1, tpot_slo=0.04)
    pred = serve_sim.predict(trace, cm, "round_robin", 2, args)
    assert 0.0 < pred["sim_slo_attainment"] < 1.0
    records = [
        serve_load.Record(i, 0, a, ttft=f - a, e2e=e - a, completion_tokens=n)
        for i, (a, f, e, n) in enumerate(pred["sim_records"])
    ]
    measured = serve_load.summarize("round_robin", records, 99.0, args)
    assert measured["goodput_rps"] == pytest.approx(pred["sim_goodput_rps"], rel=1e-12)
    assert measured["window_s"] == pytest.approx(pred["sim_wall_s"], rel=1e-12)


def test_a_run_s_speed_is_the_mean_of_its_probes_before_and_after(
    serve_predict: ModuleType,
) -> None:
    assert serve_predict.run_speed({"probe_s": 1.0, "probe_after_s": 1.4}) == pytest.approx(1.2)
    # Runs saved before the probe after existed keep their one probe.
    assert serve_predict.run_speed({"probe_s": 0.9}) == pytest.approx(0.9)
    assert serve_predict.run_speed({}) is None
