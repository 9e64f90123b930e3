"""The simulator against a model-free copy of the engine's loop, on a virtual clock.

`ScriptedEngine` does what ``deepinfer``'s engine and a replay client do each iteration:
requests that arrived by now join the queue, `ContinuousBatchPolicy` (the policy the engine's
scheduler runs) plans the step, the step takes a known time (the live-fit form: one fixed
cost, token and attention terms per prefill chunk, per-sequence and per-context decode
terms), a prompt's last chunk emits the first token, each decode one more. Simulating the
same arrivals with a cost model of those coefficients must reproduce every request's first
token and finish time exactly: any difference in admission, chunking, decode order, context
accounting or how a mixed step is charged shows up here as a TTFT error, separated from
the noise of a real machine.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest

from deepinfer_sched.costmodel import FittedCostModel
from deepinfer_sched.policies import BatchConfig, SchedulerConfig
from deepinfer_sched.policies.batch import ContinuousBatchPolicy, SeqState
from deepinfer_sched.sim import SimConfig, run_simulation
from deepinfer_sched.traces import Trace, TraceRequest

STEP, P1, P2, D1, D2 = 0.030, 2.5e-3, 1.5e-6, 4e-3, 2e-5
BLOCK = 16


@dataclass
class _Seq:
    rid: int
    arrival: float
    prompt: int
    max_tokens: int
    computed: int = 0
    generated: int = 0
    running: bool = False

    def state(self) -> SeqState:
        return SeqState(
            self.rid,
            self.prompt,
            self.computed,
            self.generated,
            self.max_tokens,
            arrival=self.arrival,
        )


class ScriptedEngine:
    """The engine's step loop with a known step time instead of a model."""

    def __init__(self, batch: BatchConfig, free_blocks: int = 100_000) -> None:
        self.policy = ContinuousBatchPolicy(batch)
        self.free_blocks = free_blocks

    @staticmethod
    def step_seconds(prefill: list[tuple[int, int]], batch: int, context: int) -> float:
        pre = sum(P1 * n + P2 * n * (c + (n + 1) / 2) for n, c in prefill)
        return STEP + pre + (D1 * batch + D2 * context if batch else 0.0)

    def replay(self, work: list[tuple[float, int, int]]) -> dict[int, tuple[float, float]]:
        """(first token, finish) per request for arrivals ``work`` of (time, prompt, output)."""
        now, nxt = 0.0, 0
        waiting: list[_Seq] = []
        running: list[_Seq] = []
        out: dict[int, list[float]] = {}
        while len(out) < len(work) or any(len(v) < 2 for v in out.values()):
            while nxt < len(work) and work[nxt][0] <= now:
                t, p, o = work[nxt]
                waiting.append(_Seq(nxt, t, p, o))
                nxt += 1
            if not waiting and not running:
                now = work[nxt][0]  # idle: the replay sleeps until the next arrival
                continue
            plan = self.policy.schedule(
                [s.state() for s in waiting], [s.state() for s in running], self.free_blocks, BLOCK
            )
            assert not plan.preempted
            by_id = {s.rid: s for s in waiting + running}
            decodes = [by_id[i] for i in plan.decode_ids]
            context = sum(s.computed + 1 for s in decodes)
            chunks = [(by_id[i], n) for i, n in plan.prefill_chunks]
            for s, _ in chunks:
                if not s.running:
                    waiting.remove(s)
                    running.append(s)
                    s.running = True
            now += self.step_seconds([(n, s.computed) for s, n in chunks], len(decodes), context)
            for s in decodes:
                s.computed += 1
                s.generated += 1
            for s, n in chunks:
                s.computed += n
                if s.computed == s.prompt:
                    s.generated = 1
                    out[s.rid] = [now]
            for s in list(running):
                if s.generated >= s.max_tokens:
                    running.remove(s)
                    out[s.rid].append(now)
        return {i: (v[0], v[1]) for i, v in out.items()}


def _work(n: int, rate: float, seed: int) -> list[tuple[float, int, int]]:
    rng = random.Random(seed)
    t, work = 0.0, []
    for _ in range(n):
        work.append((t, rng.randint(16, 700), rng.randint(1, 40)))
        t += rng.expovariate(rate)
    return work


def _simulate(
    work: list[tuple[float, int, int]], batch: BatchConfig, fast_forward: bool
) -> dict[int, tuple[float, float]]:
    cm = FittedCostModel((STEP, P1, P2), (STEP, D1, D2), 1024, 1_000_000)
    trace = Trace(tuple(TraceRequest(i, a, p, o, ()) for i, (a, p, o) in enumerate(work)), BLOCK)
    cfg = SimConfig(
        SchedulerConfig(batch=batch),
        num_instances=1,
        kv_capacity_tokens=1_000_000,
        ttft_slo_s=1e3,
        tpot_slo_s=1e3,
        fast_forward=fast_forward,
    )
    res = run_simulation(trace, cfg, 0, cost_model=cm)
    return {r.request_id: (r.first_token_s, r.finish_s) for r in res.records}


@pytest.mark.parametrize("fast_forward", [True, False])
@pytest.mark.parametrize(
    ("batch", "rate"),
    [
        (BatchConfig(32, 2048, True), 0.5),  # the fidelity benchmark's engine, near saturation
        (BatchConfig(4, 256, True), 2.0),  # chunked prompts, a full batch: requests queue
        (BatchConfig(8, 512, False), 1.0),  # whole prompts only
    ],
)
def test_simulator_reproduces_the_engine_loop_exactly(
    batch: BatchConfig, rate: float, fast_forward: bool
) -> None:
    work = _work(40, rate, seed=int(rate * 10) + batch.max_num_seqs)
    engine = ScriptedEngine(batch).replay(work)
    sim = _simulate(work, batch, fast_forward)
    queued = sum(1 for i, (t, _, _) in enumerate(work) if engine[i][0] - t > 1.0)
    assert queued >= 3, "the workload must make requests queue, or queueing goes unchecked"
    for i in range(len(work)):
        assert sim[i][0] == pytest.approx(engine[i][0], rel=1e-9, abs=1e-9), f"TTFT of {i}"
        assert sim[i][1] == pytest.approx(engine[i][1], rel=1e-9, abs=1e-9), f"finish of {i}"
