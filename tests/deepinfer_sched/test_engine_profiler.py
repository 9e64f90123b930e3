"""`costmodel.profile_engine` over a fake `SteppableEngine` whose step times are known."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from deepinfer_sched.costmodel import (
    EngineLimits,
    ProfileGrid,
    SteppableEngine,
    fit_profile,
    profile_engine,
    profile_header,
)

# The fake's cost model: what each step "takes" on its clock.
PREFILL_PER_TOKEN = 1e-4
DECODE_BASE = 2e-3
DECODE_PER_SEQ = 5e-4


@dataclass
class _Req:
    prompt: list[int]
    max_tokens: int
    computed: int = 0
    generated: int = 0


@dataclass
class FakeEngine:
    """Prefills one waiting prompt per step (alone), else decodes every running sequence;
    each step advances ``now`` by a known amount."""

    limits: EngineLimits
    vocab_size: int = 100
    fail_at_step: int | None = None
    now: float = 0.0
    steps: int = 0
    waiting: list[_Req] = field(default_factory=list)
    running: list[_Req] = field(default_factory=list)
    namespaces: set[bytes] = field(default_factory=set)
    prompts: list[list[int]] = field(default_factory=list)
    step_kinds: list[tuple[str, int]] = field(default_factory=list)

    def add_request(self, prompt_ids: list[int], max_tokens: int, namespace: bytes) -> None:
        self.namespaces.add(namespace)
        self.prompts.append(list(prompt_ids))
        self.waiting.append(_Req(list(prompt_ids), max_tokens))

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def step(self) -> None:
        self.steps += 1
        if self.fail_at_step is not None and self.steps == self.fail_at_step:
            raise RuntimeError("device lost")
        if self.waiting:
            req = self.waiting.pop(0)
            req.computed, req.generated = len(req.prompt), 1
            self.now += PREFILL_PER_TOKEN * len(req.prompt)
            self.step_kinds.append(("prefill", len(req.prompt)))
            if req.generated < req.max_tokens:
                self.running.append(req)
            return
        self.now += DECODE_BASE + DECODE_PER_SEQ * len(self.running)
        self.step_kinds.append(("decode", len(self.running)))
        for req in self.running:
            req.generated += 1
            req.computed += 1
        self.running = [r for r in self.running if r.generated < r.max_tokens]

    def decoding_together(self, batch_size: int) -> bool:
        return not self.waiting and len(self.running) == batch_size

    def abort_all(self) -> None:
        self.waiting.clear()
        self.running.clear()

    def clock(self) -> float:
        return self.now


def _limits(**overrides: int) -> EngineLimits:
    values = {
        "max_batched_tokens": 512,
        "max_num_seqs": 8,
        "capacity_tokens": 4096,
        "max_model_len": 1024,
        "block_size": 16,
    }
    values.update(overrides)
    return EngineLimits(**values)


def test_known_step_times_come_back_as_rows_over_the_whole_grid() -> None:
    engine = FakeEngine(_limits())
    _: SteppableEngine = engine  # the fake satisfies the Protocol (mypy checks this line)
    grid = ProfileGrid(
        prefill_lens=(16, 64, 256), batch_sizes=(1, 2, 4), context_lens=(32, 128), repeats=2
    )
    header = profile_header({"model": "fake"}, kv_bytes_per_token=64, kv_capacity_tokens=4096)
    prof = profile_engine(engine, grid, header=header, clock=engine.clock)
    assert not engine.has_unfinished()
    assert prof["engine"]["model"] == "fake" and prof["kv_capacity_tokens"] == 4096
    assert [r["new_tokens"] for r in prof["prefill"]] == [16, 64, 256]
    for row in prof["prefill"]:
        assert row["seconds"] == [pytest.approx(PREFILL_PER_TOKEN * row["new_tokens"])] * 2
    shapes = {(r["batch_size"], r["context_tokens"] // r["batch_size"]) for r in prof["decode"]}
    assert {b for b, _ in shapes} == {1, 2, 4} and len(prof["decode"]) == 6
    for row in prof["decode"]:
        expected = DECODE_BASE + DECODE_PER_SEQ * row["batch_size"]
        assert row["seconds"] == [pytest.approx(expected)] * grid.decode_steps
    # Warm-up ran first (two 32-token prompts), and no prompt reuses a token id below 3.
    assert engine.step_kinds[:2] == [("prefill", 32), ("prefill", 32)]
    assert all(3 <= t < engine.vocab_size for p in engine.prompts for t in p)
    assert len(engine.namespaces) == 1
    cm = fit_profile(prof)
    assert cm.decode_step_time(4, 400) == pytest.approx(DECODE_BASE + 4 * DECODE_PER_SEQ, rel=0.05)


def test_sizes_beyond_the_limits_are_skipped() -> None:
    engine = FakeEngine(_limits(max_batched_tokens=64, max_num_seqs=2))
    grid = ProfileGrid(prefill_lens=(16, 64, 65), batch_sizes=(1, 2, 3), context_lens=(16,))
    prof = profile_engine(engine, grid, clock=engine.clock)
    assert [r["new_tokens"] for r in prof["prefill"]] == [16, 64]
    assert [r["batch_size"] for r in prof["decode"]] == [1, 2]
    assert "engine" not in prof  # no header asked for


def test_same_seed_same_prompts_and_a_fresh_namespace_per_run() -> None:
    grid = ProfileGrid(prefill_lens=(8,), batch_sizes=(1,), context_lens=(8,), repeats=1)
    a, b = FakeEngine(_limits()), FakeEngine(_limits())
    profile_engine(a, grid, seed=7, clock=a.clock)
    profile_engine(b, grid, seed=7, clock=b.clock)
    assert a.prompts == b.prompts
    assert a.namespaces != b.namespaces


def test_a_busy_engine_is_refused_by_name() -> None:
    engine = FakeEngine(_limits())
    engine.add_request([5, 6], 2, b"")
    with pytest.raises(ValueError, match="engine: profile an idle engine"):
        profile_engine(engine, clock=engine.clock)


def test_a_tiny_vocabulary_is_refused_by_name() -> None:
    engine = FakeEngine(_limits(), vocab_size=3)
    with pytest.raises(ValueError, match="vocab_size"):
        profile_engine(engine, clock=engine.clock)


def test_a_failing_step_leaves_the_engine_idle_and_propagates() -> None:
    engine = FakeEngine(_limits(), fail_at_step=6)
    grid = ProfileGrid(prefill_lens=(16,), batch_sizes=(2,), context_lens=(16,), repeats=1)
    with pytest.raises(RuntimeError, match="device lost"):
        profile_engine(engine, grid, clock=engine.clock)
    assert not engine.has_unfinished()
