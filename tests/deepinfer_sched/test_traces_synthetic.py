"""Synthetic trace generator: targets, determinism, structure, arrival processes."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from deepinfer_sched.traces import SyntheticTraceConfig, arrival_times, synthetic_trace


@pytest.fixture(scope="module")
def default_trace_stats() -> list[tuple[float, float]]:
    out = []
    for seed in (0, 1):
        s = synthetic_trace(SyntheticTraceConfig(num_requests=20_000, seed=seed)).stats()
        out.append((s.mean_input_len, s.reusable_fraction))
    return out


def test_defaults_hit_the_production_targets(
    default_trace_stats: list[tuple[float, float]],
) -> None:
    for mean_in, reuse in default_trace_stats:
        assert 70_000 <= mean_in <= 84_000  # target 77k
        assert 0.945 <= reuse <= 0.975  # target about 0.96


def test_same_seed_same_trace_other_seed_differs() -> None:
    cfg = SyntheticTraceConfig(num_requests=800, seed=3)
    a, b = synthetic_trace(cfg), synthetic_trace(cfg)
    assert a == b
    c = synthetic_trace(SyntheticTraceConfig(num_requests=800, seed=4))
    assert a != c


def test_structure() -> None:
    cfg = SyntheticTraceConfig(num_requests=3000, seed=5, block_size=256)
    t = synthetic_trace(cfg)
    assert len(t) == 3000 and t.block_size == 256
    assert [r.request_id for r in t] == list(range(3000))
    arr = np.array([r.arrival_s for r in t])
    assert np.all(np.diff(arr) >= 0)
    by_conv: dict[int, list[int]] = {}
    for r in t:
        assert len(r.block_hashes) == r.input_len // 256
        assert 1 <= r.output_len <= cfg.max_output_len
        assert r.input_len <= cfg.max_input_len
        assert r.kind in ("chat", "agent") and r.tenant.startswith("tenant-")
        by_conv.setdefault(r.conversation_id, []).append(r.request_id)
    # Histories grow: each turn's prompt extends the previous turn's prompt.
    for ids in by_conv.values():
        for prev, cur in itertools.pairwise(ids):
            p, c = t[prev], t[cur]
            assert c.input_len > p.input_len
            assert c.block_hashes[: len(p.block_hashes)] == p.block_hashes
    # Shared system prompts: conversations with different ids share leading blocks.
    firsts = {t[ids[0]].block_hashes[0] for ids in by_conv.values() if t[ids[0]].block_hashes}
    assert len(firsts) < len(by_conv)
    # Tenants never share blocks.
    owner: dict[int, str] = {}
    for r in t:
        for h in r.block_hashes:
            assert owner.setdefault(h, r.tenant) == r.tenant


def test_rate_and_kinds() -> None:
    t = synthetic_trace(SyntheticTraceConfig(num_requests=5000, request_rate=50.0, seed=2))
    s = t.stats()
    assert s.request_rate == pytest.approx(50.0, rel=0.03)  # realised rate is fitted
    assert set(s.kinds) == {"chat", "agent"}
    chat_only = synthetic_trace(SyntheticTraceConfig(num_requests=500, agent_fraction=0.0))
    assert chat_only.stats().kinds == {"chat": 500}
    prio = synthetic_trace(
        SyntheticTraceConfig(num_requests=500, chat_priority=2, agent_priority=-1, seed=4)
    )
    assert {(r.kind, r.priority) for r in prio} == {("chat", 2), ("agent", -1)}


def test_time_scale_compresses_conversations() -> None:
    def mean_span(scale: float) -> float:
        t = synthetic_trace(SyntheticTraceConfig(num_requests=3000, time_scale=scale, seed=1))
        spans: dict[int, list[float]] = {}
        for r in t:
            spans.setdefault(r.conversation_id, []).append(r.arrival_s)
        return float(np.mean([max(v) - min(v) for v in spans.values() if len(v) > 1]))

    assert mean_span(1000.0) < mean_span(100.0) / 3


def test_config_validation() -> None:
    with pytest.raises(ValueError, match="arrival"):
        SyntheticTraceConfig(arrival="weird")
    with pytest.raises(ValueError, match="request_rate"):
        SyntheticTraceConfig(request_rate=0.0)
    with pytest.raises(ValueError, match="agent_fraction"):
        SyntheticTraceConfig(agent_fraction=1.5)
    with pytest.raises(ValueError, match="chat_user_tokens"):
        SyntheticTraceConfig(chat_user_tokens=(0.0, 1.0))
    with pytest.raises(ValueError, match="burstiness"):
        SyntheticTraceConfig(burstiness=0.5)
    assert len(synthetic_trace(SyntheticTraceConfig(num_requests=0))) == 0


@pytest.mark.parametrize("process", ["poisson", "gamma", "mmpp"])
def test_arrival_processes_mean_rate_and_burstiness(process: str) -> None:
    rng = np.random.default_rng(0)
    t = arrival_times(rng, 40_000, 5.0, process, burstiness=8.0, dwell_s=20.0)
    assert np.all(np.diff(t) >= 0)
    assert len(t) / t[-1] == pytest.approx(5.0, rel=0.1)
    counts = np.bincount((t // 10.0).astype(np.int64))[:-1]  # arrivals per 10 s window
    dispersion = counts.var() / counts.mean()  # 1 for Poisson, larger when bursty
    if process == "poisson":
        assert 0.8 < dispersion < 1.25
    else:
        assert dispersion > 2.0


@settings(max_examples=8)
@given(st.sampled_from(["poisson", "gamma", "mmpp"]), st.integers(1, 300), st.integers(0, 99))
def test_synthetic_any_arrival_is_valid(process: str, n: int, seed: int) -> None:
    t = synthetic_trace(
        SyntheticTraceConfig(num_requests=n, seed=seed, arrival=process, block_size=1024)
    )
    assert len(t) == n
    assert 0.0 <= t.stats().reusable_fraction < 1.0
